"""The guarded test run: tests that import or run the agent's code run as a user who cannot touch
what decides the reward, and their outcomes reach the root side over a pipe (issue 32).

A test script calls the guard instead of pytest (the sidecar sets ``REROLL_GUARD`` to its
launcher in the script's environment, `GuardFolder`)::

    "$REROLL_GUARD" [--python PY] [--junitxml OUT.xml] [--ctrf OUT.json] -- PYTEST_ARGS...

The guard (root, the test script's user) then:

1. writes `reroll_sidecar.guard_runner.RUNNER` into a fresh folder, and canary tests of fresh
   random content (some must pass, some must fail) in two or three modules named in the tests'
   own style beside the first test file, put among the test files at random places
   (`reroll_sidecar.guard_canaries`); makes the child a fresh HOME;
2. runs ``PY runner.py FD -- PYTEST_ARGS...`` (the canaries among them) as `GUARD_UID`/`GUARD_GID`
   (no supplementary groups, ``no_new_privs``: no set-uid program of the image lifts it back to
   root) in its own session. That user owns nothing: it cannot write the report, the reward files,
   the verifier's folder or the sidecar's report folder (all root's, mode 0700 or 0755). The runner
   writes one line per outcome to FD, a pipe whose other end only the guard holds;
3. when the child ends, kills every process of `GUARD_UID` (nothing it left keeps the pipe or
   writes later), reads the pipe to its end and judges it (`judge`): a line that is not one of
   the runner's, a line after the session's end, or a canary whose outcome is not the expected
   one is a *verifier error* (the framework or the stream was tampered with); a run that never
   reached its end is *failing* (a crash, an ``os._exit``); else *passed* or *failing* by the
   tests' outcomes;
4. writes the reports asked for (JUnit XML, CTRF JSON: the tests' outcomes, canaries left out)
   — none on a verifier error — and, when the sidecar's own report check is on (its
   ``--junitxml``/``--log-file`` in ``PYTEST_ADDOPTS``, `reroll_sidecar.pytest_report`), that
   check's files too; and the verdict into the sidecar's folder (``--verdicts``), which
   `read_verdicts` turns into the verify's reward error.

Exit status: 0 every test passed, 1 some failed or the run did not finish, 2 a verifier error or
a usage error.

What it does not guarantee: code under test shares the child's process, so it can write lines
of its own to the pipe or patch the framework; the canaries catch a forger that cannot tell
them from the tests — by name, folder, module, form or position it cannot; one that reads the
tests' source or traces which tests call its code still can (`reroll_sidecar.guard_canaries`),
and can then report a failing test as passed. A test script that does not call the guard, or computes its
reward from something the child can write, is not covered.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

from reroll_sidecar.guard_canaries import Canaries, as_given, first_test_file, placed
from reroll_sidecar.guard_runner import RUNNER

GUARD_UID = 65530
"""The child's user id: no file of the image or the sandbox is its."""
GUARD_GID = 65530
MAX_STREAM_BYTES = 64 * 1024 * 1024
"""More from the child is a verifier error."""
KILL_ROUNDS = 50
READ_TIMEOUT_SECONDS = 30.0
"""How long the guard waits for its pipe's end once the child's processes are gone."""
PR_SET_NO_NEW_PRIVS = 38
SIDECAR_REPORT_OPTIONS = ("--junitxml=", "--log-file=", "--log-file-level=")
"""The sidecar's report check's options (`reroll_sidecar.pytest_report.ReportFolder.addopts`),
which the guard honours itself instead of the child."""
VERDICT_PREFIX = "verdict-"


@dataclass
class Verdict:
    """What `judge` made of a run."""

    status: str
    """``passed``, ``failing`` or ``error`` (a verifier error: the run was tampered with)."""
    note: str
    outcomes: dict[str, str] = field(default_factory=dict)
    """Test id → ``passed``, ``failed``, ``error`` or ``skipped`` (canaries left out)."""


def _outcome(phases: dict[str, str]) -> str:
    """One test's outcome from its phases' (``setup``/``call``/``teardown``/``collect``)."""
    if phases.get("collect") == "failed" or "failed" in (phases.get("setup"), phases.get("teardown")):
        return "error"
    if phases.get("call") == "failed":
        return "failed"
    if "skipped" in (phases.get("setup"), phases.get("call")):
        return "skipped"
    return "passed" if phases.get("call") == "passed" else "error"


def judge(stream: bytes, canaries: Canaries) -> Verdict:
    """Judge the runner's lines (`reroll_sidecar.guard_runner`) against `canaries`."""
    phases: dict[str, dict[str, str]] = {}
    ended = False
    for number, line in enumerate(stream.splitlines(), 1):
        try:
            record = json.loads(line)
            kind = record["t"]
        except (ValueError, TypeError, KeyError):
            return Verdict("error", f"line {number} from the test run is not the guard's: {line[:200]!r}")
        if ended:
            return Verdict("error", f"line {number} from the test run came after its end: {line[:200]!r}")
        if kind == "end":
            ended = True
            continue
        fields = (record.get("id"), record.get("when"), record.get("outcome"))
        if kind != "case" or not all(isinstance(f, str) for f in fields):
            return Verdict("error", f"line {number} from the test run is malformed: {line[:200]!r}")
        test_id, when, outcome = fields
        if phases.setdefault(test_id, {}).setdefault(when, outcome) != outcome:
            return Verdict("error", f"{test_id} ({when}) was reported twice, differently")
    outcomes = {test_id: _outcome(p) for test_id, p in phases.items()}
    if ended and (wrong := canaries.wrong(outcomes)):
        return Verdict(
            "error",
            f"the guard's canaries came back wrong ({wrong[:1000]}): the test framework or its"
            " outcomes were tampered with",
        )
    outcomes = {test_id: outcome for test_id, outcome in outcomes.items() if not canaries.key(test_id)}
    counts = {
        key: sum(1 for o in outcomes.values() if o == key) for key in ("passed", "failed", "error", "skipped")
    }
    summary = ", ".join(f"{value} {key}" for key, value in counts.items())
    if not ended:
        return Verdict(
            "failing", f"the test run ended before its session finished ({summary} by then)", outcomes
        )
    if counts["failed"] or counts["error"] or not counts["passed"]:
        return Verdict("failing", f"guarded test run: {summary}", outcomes)
    return Verdict("passed", f"guarded test run: {summary}", outcomes)


def _drop_privileges() -> None:  # pragma: no cover - runs in the forked child
    """In the child, before exec: no way back to root (``no_new_privs``); the ids are Popen's."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def kill_user(uid: int) -> int:
    """SIGKILL every process of `uid` (real, effective or saved) in the caller's PID namespace
    until none is left; how many were killed. Raises RuntimeError when some outlive
    `KILL_ROUNDS` rounds.

    Only the caller's own PID namespace: a docker container's processes run as the same host uid
    (no user namespace), and a guard on the host (``local-plain`` as root, the tests) once
    killed a concurrent container's test run this way. Each is killed by its pid in that
    namespace (``NSpid``), which is not the pid its ``/proc`` entry has when ``/proc`` is an
    outer namespace's (docker's verify keeps the container's)."""
    own = _pid_namespace("self")
    killed = 0
    for _ in range(KILL_ROUNDS):
        found = [local for pid in _pids() if (local := _local_pid(pid, uid, own)) is not None]
        if not found:
            return killed
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    raise RuntimeError(f"processes of uid {uid} outlived {KILL_ROUNDS} rounds of SIGKILL")


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _pid_namespace(pid: int | str) -> tuple[int, int] | None:
    """The PID namespace of `pid` (``self``: the caller) as ``(device, inode)``; None when gone."""
    try:
        found = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _local_pid(pid: int, uid: int, own: tuple[int, int] | None) -> int | None:
    """`pid` (a ``/proc`` entry) as the caller's namespace numbers it, when it is a live process
    of `uid` (real, effective, saved or file-system) in the namespace `own`; else None."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        if fields["State"].split()[0] in ("Z", "X") or uid not in {int(v) for v in fields["Uid"].split()}:
            return None
    except (OSError, ValueError, KeyError, IndexError):
        return None
    if _pid_namespace(pid) != own:
        return None
    numbers = fields.get("NSpid", "").split()
    return int(numbers[-1]) if numbers else pid


def _read_all(fd: int, into: bytearray) -> None:
    """Read `fd` to its end into `into` (at most `MAX_STREAM_BYTES` + 1 bytes kept); closes it."""
    with os.fdopen(fd, "rb", buffering=0) as stream:
        while chunk := stream.read(65536):
            if len(into) <= MAX_STREAM_BYTES:
                into += chunk


def _child_env(home: str) -> dict[str, str]:
    """The test script's environment for the child, less the sidecar's report options (the guard
    writes that report itself) and with the child's own HOME."""
    env = dict(os.environ)
    if "PYTEST_ADDOPTS" in env:
        words = shlex.split(env["PYTEST_ADDOPTS"])
        env["PYTEST_ADDOPTS"] = shlex.join(w for w in words if not w.startswith(SIDECAR_REPORT_OPTIONS))
    env.pop("REROLL_GUARD", None)
    env.update(HOME=home, USER="reroll-guard", LOGNAME="reroll-guard")
    return env


def open_folders(paths: list[str]) -> list[tuple[str, int, int]]:
    """Let the guard's group into the folders on the way to `paths` (the test script's folder and
    the test files) that others cannot enter — the verifier's folder is root's, mode 0700 — by
    handing such a folder to `GUARD_GID` with group read and search; returns each changed
    folder's former ``(path, gid, mode)`` for `close_folders`. The agent's user is not in that
    group, and its processes are stopped while the guard runs."""
    changed: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for path in paths:
        folder = os.path.abspath(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)))
        chain: list[str] = []
        while folder not in seen and folder != "/":
            seen.add(folder)
            chain.append(folder)
            folder = os.path.dirname(folder)
        for entry in chain:
            st = os.lstat(entry)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & stat.S_IXOTH:
                changed.append((entry, st.st_gid, stat.S_IMODE(st.st_mode)))
                os.chown(entry, -1, GUARD_GID, follow_symlinks=False)
                os.chmod(entry, stat.S_IMODE(st.st_mode) | 0o050, follow_symlinks=False)
    return changed


def close_folders(changed: list[tuple[str, int, int]]) -> None:
    """Put back what `open_folders` changed."""
    for entry, gid, mode in reversed(changed):
        with contextlib.suppress(OSError):
            os.chown(entry, -1, gid, follow_symlinks=False)
            os.chmod(entry, mode, follow_symlinks=False)


def run_guarded(python: str, args: list[str], canaries: Canaries | None = None) -> Verdict:
    """Steps 1 to 3 of the module docstring: run `args` under pytest (or unittest) as the guard's
    user with `canaries` (fresh ones in the style of the first test file, written beside it:
    `reroll_sidecar.guard_canaries`), and judge what came back. Raises OSError when the child
    cannot start."""
    folder = tempfile.mkdtemp(prefix="reroll-guard-")
    home = tempfile.mkdtemp(prefix="reroll-guard-home-")
    opened: list[tuple[str, int, int]] = []
    first = first_test_file(args)
    beside = os.path.dirname(os.path.abspath(first)) if first else os.getcwd()
    canaries = canaries or Canaries.fresh(first, beside)
    try:
        opened = open_folders([os.getcwd(), *(arg for arg in args if os.path.exists(arg))])
        os.chmod(folder, 0o755)
        os.chown(home, GUARD_UID, GUARD_GID)
        runner = os.path.join(folder, "runner.py")
        with open(runner, "w", encoding="utf-8") as handle:
            handle.write(RUNNER)
        os.chmod(runner, 0o644)
        args = placed(args, as_given(canaries.write(beside, folder), first))
        read_end, write_end = os.pipe()
        received = bytearray()
        reader = threading.Thread(target=_read_all, args=(read_end, received), daemon=True)
        reader.start()
        try:
            child = subprocess.Popen(
                [python, runner, str(write_end), "--", *args],
                pass_fds=(write_end,),
                env=_child_env(home),
                user=GUARD_UID,
                group=GUARD_GID,
                extra_groups=[],
                preexec_fn=_drop_privileges,
                start_new_session=True,
            )
        finally:
            os.close(write_end)
        child.wait()
        killed = kill_user(GUARD_UID)
        reader.join(READ_TIMEOUT_SECONDS)
    finally:
        canaries.remove()
        close_folders(opened)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    if reader.is_alive():
        return Verdict("error", "the guard's pipe stayed open after every process of the test run was killed")
    if len(received) > MAX_STREAM_BYTES:
        return Verdict("error", f"the test run wrote more than {MAX_STREAM_BYTES} bytes to the guard's pipe")
    verdict = judge(bytes(received), canaries)
    if killed:
        verdict.note += f"; {killed} processes the test run left were killed"
    return verdict


JUNIT_TAGS = {"failed": "failure", "error": "error", "skipped": "skipped"}
CTRF_STATUS = {"passed": "passed", "failed": "failed", "error": "failed", "skipped": "skipped"}


def _with_unfinished(verdict: Verdict) -> dict[str, str]:
    """The outcomes to report: a run that is failing with no failed test gets one error (the
    session itself), so no report of it reads as a pass."""
    outcomes = dict(verdict.outcomes)
    if verdict.status != "passed" and not any(o in ("failed", "error") for o in outcomes.values()):
        outcomes["<the test session>"] = "error"
    return outcomes


def write_junit(path: str, verdict: Verdict) -> None:
    """`verdict`'s outcomes as a JUnit XML report at `path` (one ``testsuite``)."""
    outcomes = _with_unfinished(verdict)
    counts = {
        "tests": len(outcomes),
        "failures": sum(o == "failed" for o in outcomes.values()),
        "errors": sum(o == "error" for o in outcomes.values()),
        "skipped": sum(o == "skipped" for o in outcomes.values()),
    }
    suites = ElementTree.Element("testsuites")
    suite = ElementTree.SubElement(
        suites, "testsuite", {"name": "reroll-guard", **{k: str(v) for k, v in counts.items()}}
    )
    for test_id, outcome in outcomes.items():
        case = ElementTree.SubElement(suite, "testcase", {"name": test_id})
        if outcome in JUNIT_TAGS:
            ElementTree.SubElement(case, JUNIT_TAGS[outcome], {"message": outcome})
    ElementTree.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def write_ctrf(path: str, verdict: Verdict) -> None:
    """`verdict`'s outcomes as a CTRF JSON report at `path` (``results.summary`` and ``tests``)."""
    outcomes = _with_unfinished(verdict)
    tests = [{"name": test_id, "status": CTRF_STATUS[outcome]} for test_id, outcome in outcomes.items()]
    summary = {"tests": len(tests), "passed": 0, "failed": 0, "skipped": 0, "pending": 0, "other": 0}
    for test in tests:
        summary[str(test["status"])] += 1
    document = {"results": {"tool": {"name": "reroll-guard"}, "summary": summary, "tests": tests}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle)


def _sidecar_report_paths() -> tuple[str, str] | None:
    """The sidecar's report check's JUnit and log-file paths, from ``PYTEST_ADDOPTS``; None when off."""
    words = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    found = {
        w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if w.startswith(SIDECAR_REPORT_OPTIONS[:2])
    }
    if "--junitxml" in found and "--log-file" in found:
        return found["--junitxml"], found["--log-file"]
    return None


def write_verdict(folder: str, verdict: Verdict) -> None:
    """Record `verdict` in the sidecar's `folder` (`read_verdicts`), one file per guarded run."""
    path = os.path.join(folder, f"{VERDICT_PREFIX}{time.monotonic_ns()}-{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"status": verdict.status, "note": verdict.note}, handle)


def read_verdicts(folder: str) -> list[tuple[str, str]]:
    """The ``(status, note)`` of every guarded run recorded in `folder`, in the order they ran."""
    verdicts = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(VERDICT_PREFIX):
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                data = json.load(handle)
            verdicts.append((str(data["status"]), str(data["note"])))
    return verdicts


def main(argv: list[str]) -> int:
    """``reroll-guard`` (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="reroll-guard", description="Run tests as the guard's user.")
    parser.add_argument("--python", default="python3", help="the interpreter that runs the tests [python3]")
    parser.add_argument("--junitxml", help="write a JUnit XML report of the outcomes here")
    parser.add_argument("--ctrf", help="write a CTRF JSON report of the outcomes here")
    parser.add_argument("--verdicts", help="the sidecar's folder for the run's verdict")
    parser.add_argument("args", nargs="*", help="pytest's arguments (test files), after --")
    options = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("reroll-guard: must run as root (the test script's user in a sandbox)", file=sys.stderr)
        return 2
    try:
        verdict = run_guarded(options.python, options.args)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        verdict = Verdict("error", f"the guarded test run could not run: {exc}")
    print(f"reroll-guard: {verdict.status}: {verdict.note}", file=sys.stderr)
    if verdict.status != "error":
        for path, write in ((options.junitxml, write_junit), (options.ctrf, write_ctrf)):
            if path:
                write(path, verdict)
        if sidecar := _sidecar_report_paths():
            with open(sidecar[1], "w", encoding="utf-8"):  # pytest's log file: the run started
                pass
            write_junit(sidecar[0], verdict)
    if options.verdicts:
        write_verdict(options.verdicts, verdict)
    return {"passed": 0, "failing": 1}.get(verdict.status, 2)


class GuardFolder:
    """A fresh folder (mode 0700, root's) holding the ``reroll-guard`` launcher a verify's test
    script calls (``REROLL_GUARD``) and the verdicts of its guarded runs, in `parent` (as
    `reroll_sidecar.pytest_report.ReportFolder`'s); removed on exit.

    Attributes:
        path: the folder's absolute path. launcher: the launcher's path.
    """

    def __init__(self, parent: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix="reroll-guard-verdicts-", dir=parent)
        self.launcher = os.path.join(self.path, "reroll-guard")
        frozen = getattr(sys, "frozen", False)  # the sidecar bundle: its executable takes "guard"
        command = [sys.executable] if frozen else [sys.executable, "-m", "reroll_sidecar"]
        with open(self.launcher, "w", encoding="utf-8") as handle:
            handle.write(
                f'#!/bin/sh\nexec {shlex.join(command)} guard --verdicts {shlex.quote(self.path)} "$@"\n'
            )
        os.chmod(self.launcher, 0o700)

    def error(self) -> str:
        """The first verifier error among the recorded verdicts, or empty."""
        try:
            verdicts = read_verdicts(self.path)
        except (OSError, ValueError, KeyError) as exc:
            return f"the guard's verdicts are unreadable: {exc}"
        return next((f"guarded test run: {note}" for status, note in verdicts if status == "error"), "")

    def notes(self) -> list[str]:
        """Every recorded verdict as ``status: note``."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            return [f"{status}: {note}" for status, note in read_verdicts(self.path)]
        return []

    def apply(self, result: pb.VerifyResult) -> None:
        """Fold the recorded verdicts into a verify's `result`: a verifier error among them (a
        canary came back wrong, the stream was tampered with) clears the rewards and is the
        reward error; every verdict is appended to the pytest note."""
        if notes := self.notes():
            joined = "; ".join(f"reroll-guard {note}" for note in notes)
            result.pytest_report = f"{result.pytest_report}; {joined}" if result.pytest_report else joined
        if error := self.error():
            result.rewards.clear()
            result.ClearField("graded")
            result.reward_error = error

    def __enter__(self) -> GuardFolder:
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
