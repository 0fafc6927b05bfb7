"""The child side of `reroll_sidecar.guard`: the program the sandbox's own ``python3`` runs as the
guard's user, with the tests (and so the agent's code) in it.

`RUNNER` is its source, written into the guard's folder at each run (the sidecar bundle holds no
``.py`` files a foreign interpreter could import). Usage: ``python3 runner.py FD -- ARGS...``:

- with pytest importable, it runs ``pytest.main(ARGS + [--continue-on-collection-errors])`` with a
  plugin that writes one JSON line per test phase, per failed collection and at the session's end
  to file descriptor FD (a pipe only the guard reads);
- without pytest, it loads each ARG that names a ``*.py`` file with unittest's loader and writes
  the same lines from a `unittest.TestResult`.

Lines: ``{"t": "case", "id": ID, "when": "setup"|"call"|"teardown"|"collect", "outcome":
"passed"|"failed"|"skipped"}`` and, last, ``{"t": "end", "status": EXIT_STATUS}``. FD is made
non-inheritable first, so programs the tests start do not get it; the code under test runs in
this process and can still write to it — which is why the guard plants canaries and distrusts a
line after the end.
"""

from __future__ import annotations

RUNNER = r"""
import json, os, sys

_fd = int(sys.argv[1])
os.set_inheritable(_fd, False)
_args = sys.argv[sys.argv.index("--") + 1:]
sys.path[0] = os.getcwd()  # as "python3 -m pytest" from the test script's folder


def _emit(record):
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(_fd, data):]


class RerollGuardPlugin:
    def pytest_runtest_logreport(self, report):
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "skipped" if outcome == "skipped" else "passed"
        _emit({"t": "case", "id": report.nodeid, "when": report.when, "outcome": outcome})

    def pytest_collectreport(self, report):
        if report.failed:
            test_id = report.nodeid or "<collection>"
            _emit({"t": "case", "id": test_id, "when": "collect", "outcome": "failed"})

    def pytest_sessionfinish(self, session, exitstatus):
        _emit({"t": "end", "status": int(exitstatus)})


def _run_unittest():
    import importlib.util, unittest

    class Result(unittest.TextTestResult):
        def _case(self, test, outcome):
            _emit({"t": "case", "id": test.id(), "when": "call", "outcome": outcome})

        def addSuccess(self, test):
            super().addSuccess(test)
            self._case(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._case(test, "failed")

        def addError(self, test, err):
            super().addError(test, err)
            self._case(test, "failed")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._case(test, "skipped")

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._case(test, "passed")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._case(test, "failed")

    suite = unittest.TestSuite()
    for arg in _args:
        if not arg.endswith(".py"):
            continue
        if not os.path.isfile(arg):
            print(f"cannot load {arg}: no such file (or not readable)", file=sys.stderr)
            _emit({"t": "case", "id": arg, "when": "collect", "outcome": "failed"})
            continue
        name = os.path.splitext(os.path.basename(arg))[0]
        sys.path.insert(0, os.path.dirname(os.path.abspath(arg)))
        try:
            spec = importlib.util.spec_from_file_location(name, arg)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except BaseException as exc:  # the code under test failed to import: an error, not the end
            print(f"cannot load {arg}: {exc!r}", file=sys.stderr)
            _emit({"t": "case", "id": arg, "when": "collect", "outcome": "failed"})
            continue
        suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
    result = unittest.TextTestRunner(verbosity=2, resultclass=Result).run(suite)
    _emit({"t": "end", "status": 0 if result.wasSuccessful() else 1})
    return 0 if result.wasSuccessful() else 1


try:
    import pytest
except ImportError:
    pytest = None
if pytest is None:
    sys.exit(_run_unittest())
sys.exit(pytest.main([*_args, "--continue-on-collection-errors"], plugins=[RerollGuardPlugin()]))
"""
