"""Crash safety of whole rollouts (real `reroll` subprocesses): a SIGKILLed proxy or sidecar
ends the rollout with status ``error`` and its cause, never a hang, and a rollout whose proxy
was killed is completed by ``reroll continue``.

They run on `local-plain`, whose sidecar and agent are host processes the test finds and kills by
pid; the isolated `local` sandbox's end with a killed controller is in tests/sandbox/test_isolated.py."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.runfolder.run import load_run_folder
from reroll.sandbox.local.plain import kill_sandbox_processes

REROLL = str(Path(sys.executable).parent / "reroll")
SANDBOX = ("--sandbox", "local-plain", "--network", "full")
"""The unisolated sandbox, which has only the host's network (the example tasks ask for none)."""
pytestmark = pytest.mark.slow


def wait_for(condition: Callable[[], bool], timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_seconds} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR for the sandboxes (a unix socket path must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def reroll_process(*args: str, cwd: Path, tmp: Path) -> Iterator[subprocess.Popen[str]]:
    """`reroll ARGS` running with its sandboxes under `tmp`; killed and reaped on the way out."""
    process = subprocess.Popen(
        [REROLL, *args],
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def finish(process: subprocess.Popen[str], timeout_seconds: float) -> str:
    try:
        output, _ = process.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"reroll hung for {timeout_seconds} s")
    print(output)
    return output


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_dead_sidecar_is_an_error_with_its_cause(tmp_path: Path, short_tmp: Path) -> None:
    task = tmp_path / "slow"
    pid_file = tmp_path / "agent.pid"
    (task / "oracle").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.md").write_text("---\nname: slow\n---\nWait.\n")
    (task / "oracle" / "solve.sh").write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 120\n")
    (task / "verifier" / "test.sh").write_text("#!/bin/sh\nexit 0\n")
    args = ("run", str(task), "--agent", "oracle", "--job-name", "k", *SANDBOX)
    try:
        with reroll_process(*args, cwd=tmp_path, tmp=short_tmp) as process:
            wait_for(pid_file.exists, 60, "the agent to start")
            (ready,) = short_tmp.glob("reroll-local-*/.reroll/sidecar.ready.json")
            killed_at = time.monotonic()
            os.kill(read_json(ready)["pid"], signal.SIGKILL)
            output = finish(process, 60)
            assert time.monotonic() - killed_at < 30
            assert not running(int(pid_file.read_text())), "the orphaned agent outlived its sandbox"
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the orphaned agent
    assert process.returncode == 1, output
    (run_dir,) = (tmp_path / "jobs" / "k").iterdir()
    result = read_json(run_dir / "result.json")
    assert result["status"] == "error" and result["error_category"] == "infrastructure"
    assert "sidecar" in result["error"] and "UNAVAILABLE" in result["error"]
    assert result["finished_at"]


WAIT_FOR_THE_KILL_TEST_SH = """#!/bin/sh
# Says it runs (MARKER), then waits for the test to kill the sidecar running this verification: the
# script itself cannot, from the verify's own PID namespace (the sidecar's verify_ns).
touch MARKER
sleep 30
"""


def kill_the_sidecar_once_verifying(marker: Path, sandboxes: Path, timeout_seconds: float = 60) -> None:
    """When `marker` appears, SIGKILL the sidecar whose ready file (``.reroll/sidecar.ready.json``
    of the one local-plain sandbox folder under `sandboxes`) names it."""
    deadline = time.monotonic() + timeout_seconds
    while not marker.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)
    (ready,) = sandboxes.glob("*/.reroll/sidecar.ready.json")
    os.kill(int(read_json(ready)["pid"]), signal.SIGKILL)


def test_sidecar_dying_during_verify_is_an_infrastructure_error(tmp_path: Path, short_tmp: Path) -> None:
    task = tmp_path / "doomed"
    (task / "oracle").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.md").write_text("---\nname: doomed\n---\nNothing to do.\n")
    (task / "oracle" / "solve.sh").write_text("#!/bin/sh\nexit 0\n")
    marker = tmp_path / "verifying"
    (task / "verifier" / "test.sh").write_text(WAIT_FOR_THE_KILL_TEST_SH.replace("MARKER", str(marker)))
    args = ("run", str(task), "--agent", "oracle", "--job-name", "v", *SANDBOX)
    with reroll_process(*args, cwd=tmp_path, tmp=short_tmp) as process:
        killer = threading.Thread(target=kill_the_sidecar_once_verifying, args=(marker, short_tmp))
        killer.start()
        output = finish(process, 60)
        killer.join()
    assert process.returncode == 1, output
    (run_dir,) = (tmp_path / "jobs" / "v").iterdir()
    result = read_json(run_dir / "result.json")
    assert result["status"] == "error" and result["error_category"] == "infrastructure"
    assert "sidecar" in result["error"] and "Verify" in result["error"], result["error"]
    assert result["rewards"] is None
    assert set(read_json(run_dir / "verifier" / "hardening.json")) == {
        "killed_groups",
        "restored",
        "deleted",
        "notes",
    }


@pytest.fixture(scope="module")
def steady_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fix-failing-test with every scripted turn taking 1 s, so a kill lands mid-run."""
    source = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
    task = tmp_path_factory.mktemp("tasks") / "fix-failing-test"
    shutil.copytree(source, task)
    script = yaml.safe_load((task / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn["delay_seconds"] = 1.0
    (task / "scripted-model.yaml").write_text(yaml.safe_dump(script))
    return task


def steady_run_argv(task: Path) -> tuple[str, ...]:
    """``reroll run`` of `task` with mini-swe-agent and the scripted model, in job ``k``."""
    return ("run", str(task), "--agent", "mini-swe-agent", "--model", "scripted", "--job-name", "k", *SANDBOX)


def first_exchange_recorded(job: Path) -> Path:
    """Wait until the job's only rollout has a proxy and one recorded exchange; its proxy's ready file."""
    wait_for(lambda: any(job.glob("*/harness/proxy.ready.json")), 120, "the proxy to start")
    (ready,) = job.glob("*/harness/proxy.ready.json")
    trajectory = ready.parent.parent / "trajectory" / "llm_trajectory.jsonl"
    wait_for(lambda: trajectory.exists() and trajectory.stat().st_size > 0, 120, "the first exchange")
    return ready


def continue_killed(run_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``reroll continue`` of a killed run (120 s budget)."""
    argv = [REROLL, "continue", str(run_dir), "--timeout", "120"]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("point", range(2))
def test_killed_proxy_then_continue_completes(
    point: int, steady_task: Path, tmp_path: Path, short_tmp: Path
) -> None:
    delay = random.Random(f"proxy-kill-{point}").uniform(0.0, 2.5)
    with reroll_process(*steady_run_argv(steady_task), cwd=tmp_path, tmp=short_tmp) as process:
        ready = first_exchange_recorded(tmp_path / "jobs" / "k")
        time.sleep(delay)
        os.kill(read_json(ready)["pid"], signal.SIGKILL)
        output = finish(process, 60)
    run_dir = ready.parent.parent
    result = read_json(run_dir / "result.json")
    assert process.returncode == 1, output
    assert result["status"] == "error" and result["error_category"] == "infrastructure"
    assert "LLM proxy is not answering" in result["error"]
    killed = load_run_folder(run_dir)
    assert result["counts"]["exchanges"] == len(killed.exchanges) >= 1
    print(f"proxy killed {delay:.2f} s after the first exchange: {len(killed.exchanges)} recorded")
    done = continue_killed(run_dir, tmp_path)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    (continued,) = (run_dir.parent / "continued").iterdir()
    final = read_json(continued / "result.json")
    assert final["status"] == "ok" and final["rewards"] == {"reward": 1.0}
    sources = [e.metadata.source for e in load_run_folder(continued).exchanges]
    assert sources == ["replayed"] * len(killed.exchanges) + ["live"] * (5 - len(killed.exchanges))


@pytest.mark.parametrize("point", range(2))
def test_killed_controller_then_continue_completes(
    point: int, steady_task: Path, tmp_path: Path, short_tmp: Path
) -> None:
    delay = random.Random(f"controller-kill-{point}").uniform(0.0, 2.5)
    with reroll_process(*steady_run_argv(steady_task), cwd=tmp_path, tmp=short_tmp) as process:
        ready = first_exchange_recorded(tmp_path / "jobs" / "k")
        time.sleep(delay)
        process.kill()
        process.wait(timeout=10)
    ready_files = [*ready.parent.glob("*.ready.json"), *short_tmp.glob("*/.reroll/sidecar.ready.json")]
    children = [read_json(file)["pid"] for file in ready_files]  # proxy, scripted model, sidecar
    for root in short_tmp.glob("reroll-local-*"):
        kill_sandbox_processes(str(root))  # the agent: the sidecar's orphan
    try:
        wait_for(lambda: not any(map(running, children)), 10, "reroll's children to die with it")
    finally:
        for pid in filter(running, children):  # only after a failure: leave nothing behind
            os.kill(pid, signal.SIGKILL)
    run_dir = ready.parent.parent
    killed = load_run_folder(run_dir)
    assert killed.result is None and len(killed.exchanges) >= 1
    print(f"controller killed {delay:.2f} s after the first exchange: {len(killed.exchanges)} recorded")
    done = continue_killed(run_dir, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (continued,) = (run_dir.parent / "continued").iterdir()
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    sources = [e.metadata.source for e in load_run_folder(continued).exchanges]
    assert sources == ["replayed"] * len(killed.exchanges) + ["live"] * (5 - len(killed.exchanges))
