"""Prints 1 when report.json holds every category's total value of inventory.yaml, else 0."""

import json
import os
from pathlib import Path

import yaml

workdir = Path(os.environ.get("REROLL_WORKSPACE", "/root"))
items = yaml.safe_load((workdir / "inventory.yaml").read_text())["items"]
expected: dict[str, float] = {}
for item in items:
    expected[item["category"]] = expected.get(item["category"], 0) + item["quantity"] * item["unit_price"]
try:
    report = json.loads((workdir / "report.json").read_text())
    ok = set(report) == set(expected)
    ok = ok and all(abs(report[name] - round(total, 2)) < 0.005 for name, total in expected.items())
except (OSError, ValueError, TypeError):
    ok = False
print(1 if ok else 0)
