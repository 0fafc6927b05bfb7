"""Prints the reward a CTRF report earns: 1 when it exists, counts at least one test, and every
test passed; else 0 (with the reason on stderr). Usage: python3 -I reward_from_ctrf.py CTRF.json
"""

import json
import sys

try:
    with open(sys.argv[1], encoding="utf-8") as handle:
        summary = json.load(handle)["results"]["summary"]
    tests, passed = int(summary["tests"]), int(summary["passed"])
except (OSError, ValueError, KeyError, TypeError) as exc:
    print(f"no readable CTRF report ({exc!r}): the test run did not finish; reward 0", file=sys.stderr)
    print(0)
    sys.exit(0)
print(f"CTRF summary: {summary}", file=sys.stderr)
print(1 if tests > 0 and passed == tests else 0)
