#!/bin/bash
python3 - <<'PY'
import json

import yaml

totals = {}
for item in yaml.safe_load(open("inventory.yaml"))["items"]:
    totals[item["category"]] = totals.get(item["category"], 0) + item["quantity"] * item["unit_price"]
json.dump({category: round(total, 2) for category, total in totals.items()}, open("report.json", "w"))
PY
