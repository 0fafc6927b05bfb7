"""The guarded test run (`reroll_sidecar.guard`): its judgement of the runner's stream, and real
runs as the guard's user (root only) with the forges an agent's module could plant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_sidecar import guard
from reroll_sidecar.guard_canaries import Canaries

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the guard switches user: root only")
CANARIES = Canaries.fresh()


def line(**record: object) -> bytes:
    return json.dumps(record).encode() + b"\n"


def case(test_id: str, outcome: str, when: str = "call") -> bytes:
    return line(t="case", id=test_id, when=when, outcome=outcome)


def canary_id(key: tuple[str, str, str]) -> str:
    return f"{key[0]}.py::{key[1]}::{key[2]}"


def canaries_right() -> bytes:
    return b"".join(case(canary_id(key), "passed") for key in CANARIES.must_pass) + b"".join(
        case(canary_id(key), "failed") for key in CANARIES.must_fail
    )


def test_a_clean_run_passes_and_leaves_the_canaries_out() -> None:
    stream = case("t.py::test_a", "passed") + canaries_right() + line(t="end", status=1)
    verdict = guard.judge(stream, CANARIES)
    assert verdict.status == "passed" and verdict.outcomes == {"t.py::test_a": "passed"}


def test_a_failed_test_or_a_failed_setup_is_failing() -> None:
    stream = case("t.py::a", "failed") + case("t.py::b", "passed", "setup")
    stream += case("t.py::b", "failed", "teardown")
    verdict = guard.judge(stream + canaries_right() + line(t="end", status=1), CANARIES)
    assert verdict.status == "failing" and verdict.outcomes == {"t.py::a": "failed", "t.py::b": "error"}


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (canaries_right().replace(b'"failed"', b'"passed"') + line(t="end", status=0), "canaries"),
        (case("t.py::a", "passed") + line(t="end", status=0), "canaries"),
        (canaries_right() + line(t="end", status=0) + case("t.py::a", "passed"), "after its end"),
        (canaries_right() + b"tests passed\n" + line(t="end", status=0), "not the guard's"),
        (case("t.py::a", "failed") + case("t.py::a", "passed") + canaries_right() + line(t="end"), "twice"),
    ],
    ids=["must-fail passed", "canaries missing", "after the end", "foreign line", "two outcomes"],
)
def test_a_tampered_stream_is_a_verifier_error(stream: bytes, why: str) -> None:
    verdict = guard.judge(stream, CANARIES)
    assert verdict.status == "error" and why in verdict.note, verdict


def test_a_run_that_never_ended_is_failing_not_an_error() -> None:
    verdict = guard.judge(case("t.py::a", "passed"), CANARIES)
    assert verdict.status == "failing" and "before its session finished" in verdict.note
    assert guard._with_unfinished(verdict)["<the test session>"] == "error"


def test_the_reports_count_what_came_back(tmp_path: Path) -> None:
    verdict = guard.Verdict("failing", "", {"a": "passed", "b": "failed", "c": "skipped"})
    guard.write_ctrf(str(tmp_path / "ctrf.json"), verdict)
    summary = json.loads((tmp_path / "ctrf.json").read_text())["results"]["summary"]
    assert (summary["tests"], summary["passed"], summary["failed"], summary["skipped"]) == (3, 1, 1, 1)
    guard.write_junit(str(tmp_path / "junit.xml"), verdict)
    assert 'tests="3" failures="1" errors="0" skipped="1"' in (tmp_path / "junit.xml").read_text()


MODULE = "def answer():\n    return 41\n"
TESTS = """import unittest

from answer_module import answer


class AnswerTest(unittest.TestCase):
    def test_answer(self):
        self.assertEqual(answer(), 42)
"""
ATEXIT_FORGE = """
import atexit, sys
def _forge():
    for word in sys.argv:
        if word.endswith('.xml'):
            open(word, 'w').write('<testsuites><testsuite tests="1" failures="0" errors="0"/></testsuites>')
atexit.register(_forge)
"""
DETACHED = """
import os
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "600"])
"""


def guarded_run(tmp_path: Path, module: str) -> tuple[int, str, Path]:
    """Run the guard over TESTS against `module` in a closed (0700) folder with the system's
    python3 (the test venv may be closed to the guard's user); its exit, output and report."""
    tests = tmp_path / "tests"
    tests.mkdir(mode=0o700)
    (tests / "answer_module.py").write_text(module)
    (tests / "test_answer.py").write_text(TESTS)
    for path in tests.iterdir():
        path.chmod(0o644)
    tmp_path.chmod(0o755)
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "reroll_sidecar", "guard", "--python", "/usr/bin/python3"]
    command += ["--junitxml", str(report), "--", "-p", "no:cacheprovider", "test_answer.py"]
    done = subprocess.run(command, cwd=tests, capture_output=True, text=True, timeout=120)
    assert oct(tests.stat().st_mode & 0o777) == "0o700"  # closed again
    return done.returncode, done.stdout + done.stderr, report


@needs_root
@pytest.mark.spawns
def test_the_tests_run_as_the_guard_user_and_the_report_holds(tmp_path: Path) -> None:
    status, output, report = guarded_run(tmp_path, MODULE + ATEXIT_FORGE)
    assert status == 1, output
    assert 'failures="1"' in report.read_text(), output


@needs_root
@pytest.mark.spawns
def test_a_detached_process_is_killed(tmp_path: Path) -> None:
    status, output, _ = guarded_run(tmp_path, MODULE.replace("41", "42") + DETACHED)
    assert status == 0, output
    assert "processes the test run left were killed" in output, output
    assert not guard.kill_user(guard.GUARD_UID)


def test_a_tampered_run_clears_the_rewards_and_is_the_reward_error(tmp_path: Path) -> None:
    with guard.GuardFolder(str(tmp_path)) as folder:
        guard.write_verdict(folder.path, guard.Verdict("passed", "guarded test run: 1 passed"))
        guard.write_verdict(folder.path, guard.Verdict("error", "the guard's canaries came back wrong"))
        result = pb.VerifyResult(rewards={"reward": 1.0})
        folder.apply(result)
    assert (
        not result.rewards and result.reward_error == "guarded test run: the guard's canaries came back wrong"
    )
    assert "reroll-guard passed: guarded test run: 1 passed" in result.pytest_report
    assert not os.path.exists(folder.path)


def test_an_honest_run_keeps_the_rewards(tmp_path: Path) -> None:
    with guard.GuardFolder(str(tmp_path)) as folder:
        guard.write_verdict(folder.path, guard.Verdict("failing", "guarded test run: 1 failed"))
        result = pb.VerifyResult(rewards={"reward": 0.0})
        folder.apply(result)
    assert dict(result.rewards) == {"reward": 0.0} and not result.reward_error


GUARD_AWARE_FORGE = r"""
import re, sys

# Written against reroll's guard: the runner's `_emit` (in __main__) sends each outcome to the
# guard. Turn every failed outcome into a pass, except the canaries', told apart as they used to
# be: a file in the guard's own folder, random hex names, the last file on the command line.
_main = sys.modules.get("__main__")
_send = getattr(_main, "_emit", None)
_files = [a for a in sys.argv if a.endswith(".py")]


def _canary(test_id):
    return bool(
        "reroll-guard-" in test_id
        or re.search(r"[0-9a-f]{16}", test_id)
        or (len(_files) > 2 and _files[-1].rsplit("/", 1)[-1][:-3] in test_id)
    )


def _forged(record):
    if record.get("t") == "case" and record.get("outcome") == "failed" and not _canary(record["id"]):
        record = dict(record, outcome="passed")
    _send(record)


if _send is not None:
    _main._emit = _forged
    import atexit

    atexit.register(print, "GUARD-AWARE FORGE ARMED", flush=True)  # after pytest's capture ended
"""


@needs_root
@pytest.mark.spawns
def test_a_forger_that_tells_the_canaries_apart_as_they_were_finds_none(tmp_path: Path) -> None:
    """A forger in the agent's module, written against the guard, rewrites every failed outcome
    but the canaries' (by folder, hex names, position). Canaries named, placed and ordered as the
    task's own tests give it nothing to go on: the must-fail ones come back passed, a verifier
    error (before: the forged run passed, exit 0, with a report of no failure)."""
    status, output, report = guarded_run(tmp_path, MODULE + GUARD_AWARE_FORGE)
    assert "GUARD-AWARE FORGE ARMED" in output, output
    assert status == 2 and "canaries came back wrong" in output, output
    assert not report.exists(), output


AS_GUARD_USER = ["setpriv", "--reuid=65530", "--regid=65530", "--clear-groups"]


@needs_root
@pytest.mark.spawns
def test_the_clean_up_spares_the_guard_user_of_another_pid_namespace() -> None:
    """A docker container's guard child runs as host uid 65530 too (no user namespace): the clean-up
    of a guard on the host (a ``local-plain`` rollout as root, these tests) once killed a
    concurrent container's test run ("the test run ended before its session finished"). Now it
    kills only in its own PID namespace."""
    other = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *AS_GUARD_USER, "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-u", str(guard.GUARD_UID), "sleep"], capture_output=True).returncode:
            assert time.monotonic() < deadline, "the other namespace's process did not start"
            time.sleep(0.05)
        assert guard.kill_user(guard.GUARD_UID) == 0
        assert other.poll() is None, "the other namespace's test run was killed"
    finally:
        other.kill()
        other.wait()


KILL_IN_NAMESPACE = f"""
import subprocess, time
from reroll_sidecar import guard
left = subprocess.Popen({[*AS_GUARD_USER, "sleep", "60"]!r}, start_new_session=True)
time.sleep(0.3)
print("killed", guard.kill_user(guard.GUARD_UID), "exit", left.wait(timeout=5), flush=True)
"""


@needs_root
@pytest.mark.spawns
def test_the_clean_up_kills_by_the_pid_its_own_namespace_gives(tmp_path: Path) -> None:
    """Docker's verify keeps the container's ``/proc`` in its own PID namespace: a leftover's
    ``/proc`` entry is its outer pid. Killed by that number it lived on (the guard gave up after
    50 rounds: a verifier error); now by its pid in the guard's namespace (``NSpid``)."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", KILL_IN_NAMESPACE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "killed 1 exit -9" in done.stdout, done.stdout + done.stderr
