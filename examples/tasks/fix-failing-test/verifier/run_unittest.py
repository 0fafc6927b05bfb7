"""Runs a unittest file and writes a JUnit XML report (as pytest's --junitxml) when it finishes.

Usage: python3 run_unittest.py REPORT.xml TEST_FILE.py. The report is written only after every
test ran: a run ended early (os._exit, a crash) leaves none.
"""

import sys
import unittest
import xml.etree.ElementTree as ElementTree

report, test_file = sys.argv[1], sys.argv[2]
suite = unittest.defaultTestLoader.discover(".", pattern=test_file)
result = unittest.TextTestRunner(verbosity=2).run(suite)
counts = {
    "tests": result.testsRun,
    "failures": len(result.failures),
    "errors": len(result.errors),
    "skipped": len(result.skipped),
}
suites = ElementTree.Element("testsuites")
ElementTree.SubElement(suites, "testsuite", {"name": test_file, **{k: str(v) for k, v in counts.items()}})
ElementTree.ElementTree(suites).write(report, encoding="utf-8", xml_declaration=True)
