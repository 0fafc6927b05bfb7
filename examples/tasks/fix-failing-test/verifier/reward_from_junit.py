"""Prints the reward a JUnit XML report earns: 1 when it exists, counts at least one test and no
failure or error; else 0 (with the reason on stderr). Usage: python3 -I reward_from_junit.py REPORT.xml
"""

import sys
import xml.etree.ElementTree as ElementTree

try:
    root = ElementTree.parse(sys.argv[1]).getroot()
except (OSError, ElementTree.ParseError) as exc:
    print(f"no readable test report ({exc}): the test run did not finish; reward 0", file=sys.stderr)
    print(0)
    sys.exit(0)
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
counts = {key: sum(int(suite.get(key, "0")) for suite in suites) for key in ("tests", "failures", "errors")}
print(f"test report: {counts}", file=sys.stderr)
print(1 if counts["tests"] > 0 and counts["failures"] == counts["errors"] == 0 else 0)
