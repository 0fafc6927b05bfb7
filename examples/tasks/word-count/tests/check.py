"""Checks wordcount.py on two inputs; writes {"reward": 0|1, "cases_passed": n} to argv[1]."""

import json
import subprocess
import sys
import tempfile

CASES = [
    ("a b a\nB c", "a 2\nb 2\nc 1\n"),
    ("Hello, hello... world!", "hello 2\nworld 1\n"),
]
passed = 0
for text, expected in CASES:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write(text)
    run = subprocess.run(
        [sys.executable, "wordcount.py", handle.name], capture_output=True, text=True, timeout=20
    )
    passed += run.stdout == expected
with open(sys.argv[1], "w") as out:
    json.dump({"reward": float(passed == len(CASES)), "cases_passed": passed}, out)
