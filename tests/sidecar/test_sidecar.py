"""The sidecar daemon and its client, end to end: a real sidecar subprocess, real commands, real files."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reroll.sandbox.results import STREAMED_TAIL_BYTES, VerifyOutcome, VerifyScript
from reroll.sandbox.sidecar_client import ExecExit, SidecarClient
from reroll_contracts.errors import SidecarError, SidecarUnavailable
from reroll_contracts.hardening import HardeningOptions
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

from tests.sidecar.conftest import MARKER_ENV, RunningSidecar, StartSidecar, connected


def process_gone(pid: int) -> bool:
    """Whether `pid` no longer runs (a zombie counts as gone: it was killed, only not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def wait_gone(pid: int, timeout_seconds: float = 5.0) -> bool:
    """Poll until `pid` is gone; False if it still runs after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while not process_gone(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_health_reports_the_sidecar(client: SidecarClient, sidecar: RunningSidecar) -> None:
    health = await client.health()
    assert health.ready
    assert health.version
    assert health.pid == sidecar.process.pid == sidecar.ready["pid"]
    assert health.user == pwd.getpwuid(os.geteuid()).pw_name


async def test_wait_ready_names_the_address_when_nothing_listens(short_dir: Path) -> None:
    address = f"unix:{short_dir}/nobody-listens.sock"
    async with connected(address, "token") as client:
        with pytest.raises(SidecarUnavailable, match=r"not ready after 0\.5 s") as raised:
            await asyncio.wait_for(client.wait_ready(timeout_seconds=0.5), 60)  # 60: a hang guard only
        assert address in str(raised.value)
        with pytest.raises(SidecarUnavailable, match="UNAVAILABLE"):
            await client.health()


async def test_wait_ready_waits_for_a_late_sidecar(start_sidecar: StartSidecar, short_dir: Path) -> None:
    async with connected(f"unix:{short_dir}/late.sock", "late-token") as client:
        waiting = asyncio.create_task(client.wait_ready(timeout_seconds=15))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        sidecar = await start_sidecar("unix:{dir}/late.sock", token="late-token")
        await asyncio.wait_for(waiting, timeout=5)
        assert (await client.health()).pid == sidecar.process.pid


async def test_exec_returns_output_and_exit_code(client: SidecarClient) -> None:
    result = await client.exec(["sh", "-c", "echo hello; exit 7"])
    assert result.stdout == b"hello\n"
    assert result.stderr == b""
    assert result.exit_code == 7
    assert not result.timed_out
    assert 0 < result.duration_seconds < 10


async def test_exec_separates_stderr(client: SidecarClient) -> None:
    seen: list[tuple[str, bytes]] = []
    result = await client.exec(
        ["sh", "-c", "echo out; echo err >&2"], on_output=lambda name, chunk: seen.append((name, chunk))
    )
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 0)
    assert sorted(seen) == [("stderr", b"err\n"), ("stdout", b"out\n")]
    assert result.output_text() == "out\nerr\n"


async def test_exec_honours_env_and_cwd(client: SidecarClient, tmp_path: Path) -> None:
    script = f'echo "$FOO|${{{MARKER_ENV}-unset}}|${{REROLL_SIDECAR_TOKEN-unset}}"; pwd'
    exact = await client.exec(
        ["sh", "-c", script],
        cwd=str(tmp_path),
        env={"FOO": "bar", "PATH": os.environ["PATH"]},
        inherit_env=False,
    )
    assert exact.stdout.decode().splitlines() == ["bar|unset|unset", str(tmp_path)]
    inherited = await client.exec(["sh", "-c", script], env={"FOO": "baz"})
    # The sidecar's environment is inherited, except its token, which it removed at start.
    assert inherited.stdout.decode().splitlines()[0] == "baz|from-sidecar|unset"


async def test_exec_timeout_kills_the_whole_process_group(client: SidecarClient, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    result = await client.exec(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], timeout_seconds=1.0)
    assert result.timed_out
    assert result.exit_code == -9
    assert result.duration_seconds < 10
    grandchild = int(pid_file.read_text())
    assert await wait_gone(grandchild), f"the background sleep {grandchild} survived the timeout"


LARGE_OUTPUT = (
    "import sys\n"
    "block = bytes(range(256)) * 4096 + b'\\n'\n"
    "for _ in range(20): sys.stdout.buffer.write(block)"
)
"""Prints 20 times `BLOCK` (20 MiB and 20 bytes)."""
BLOCK = bytes(range(256)) * 4096 + b"\n"  # 1 MiB + 1: chunks do not align with it


async def test_exec_streams_large_output_and_keeps_only_its_tail(client: SidecarClient) -> None:
    streamed = hashlib.sha256()
    chunk_sizes: list[int] = []

    def on_output(_name: str, chunk: bytes) -> None:
        streamed.update(chunk)
        chunk_sizes.append(len(chunk))

    result = await client.exec([sys.executable, "-c", LARGE_OUTPUT], on_output=on_output)
    assert result.exit_code == 0, result.stderr
    assert sum(chunk_sizes) == 20 * len(BLOCK) > 20_000_000
    assert streamed.hexdigest() == hashlib.sha256(BLOCK * 20).hexdigest()
    assert max(chunk_sizes) <= 64 * 1024
    assert result.stdout == (BLOCK * 20)[-STREAMED_TAIL_BYTES:]  # the caller had every chunk


async def test_exec_without_on_output_keeps_the_whole_output(client: SidecarClient) -> None:
    result = await client.exec([sys.executable, "-c", LARGE_OUTPUT])
    assert result.exit_code == 0, result.stderr
    assert hashlib.sha256(result.stdout).hexdigest() == hashlib.sha256(BLOCK * 20).hexdigest()


async def test_exec_output_is_binary_safe(client: SidecarClient) -> None:
    program = (
        "import sys; sys.stdout.buffer.write(bytes(range(256))); "
        "sys.stderr.buffer.write(bytes(range(255, -1, -1)))"
    )
    result = await client.exec([sys.executable, "-c", program])
    assert result.stdout == bytes(range(256))
    assert result.stderr == bytes(reversed(range(256)))


async def test_exec_of_a_missing_program_exits_127(client: SidecarClient) -> None:
    result = await client.exec(["reroll-no-such-program", "x"])
    assert result.exit_code == 127
    assert b"reroll-no-such-program" in result.stderr
    assert result.stdout == b""


async def test_exec_in_a_missing_cwd_is_invalid_argument(client: SidecarClient, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SidecarError, match="INVALID_ARGUMENT") as raised:
        await client.exec(["true"], cwd=str(missing))
    assert str(missing) in str(raised.value)


async def test_exec_feeds_stdin(client: SidecarClient) -> None:
    data = os.urandom(3 * 1024 * 1024)
    result = await client.exec(["cat"], stdin=data)
    assert result.exit_code == 0
    assert result.stdout == data
    without = await client.exec(["cat"])
    assert (without.stdout, without.exit_code) == (b"", 0)


async def test_exec_as_another_user(client: SidecarClient) -> None:
    if os.geteuid() == 0:
        for _ in range(20):  # switching user forks (no vfork): once crashed 1 child in 2 (gRPC fork handlers)
            result = await client.exec(["id", "-un"], user="nobody")
            assert (result.exit_code, result.stdout) == (0, b"nobody\n")
    else:
        with pytest.raises(SidecarError, match="FAILED_PRECONDITION"):
            await client.exec(["id", "-un"], user="root")


async def test_put_and_get_file_round_trip(client: SidecarClient, tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 17)
    target = tmp_path / "deep" / "er" / "blob.bin"
    assert await client.put_file(str(target), data, mode=0o640) == len(data)
    assert target.read_bytes() == data
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert await client.get_file(str(target)) == data

    script = tmp_path / "run.sh"
    await client.put_file(str(script), b"#!/bin/sh\necho ran\n", mode=0o755)
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert (await client.exec([str(script)])).stdout == b"ran\n"

    empty = tmp_path / "empty"
    assert await client.put_file(str(empty), b"", mode=0) == 0
    assert stat.S_IMODE(empty.stat().st_mode) == 0o644
    assert await client.get_file(str(empty)) == b""
    await client.put_file(str(empty), b"replaced")  # overwrite: no temp file is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "empty", "run.sh"]
    assert empty.read_bytes() == b"replaced"


async def test_get_missing_file_raises_file_not_found(client: SidecarClient, tmp_path: Path) -> None:
    missing = tmp_path / "absent.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        await client.get_file(str(missing))


async def test_put_file_needs_an_absolute_path(client: SidecarClient) -> None:
    with pytest.raises(SidecarError, match="INVALID_ARGUMENT"):
        await client.put_file("relative/file.txt", b"x")


@pytest.mark.parametrize("token", ["wrong-token", ""])
async def test_rpcs_without_the_right_token_are_unauthenticated(
    sidecar: RunningSidecar, tmp_path: Path, token: str
) -> None:
    async with connected(sidecar.address, token) as intruder:
        calls = [
            intruder.health(),
            intruder.exec(["touch", str(tmp_path / "pwned")]),
            intruder.put_file(str(tmp_path / "pwned"), b"x"),
            intruder.get_file("/etc/hostname"),
            intruder.kill(),
            intruder.verify(VerifyScript(str(tmp_path), "x", "/", {}, timeout_seconds=1)),
        ]
        for call in calls:
            with pytest.raises(SidecarError, match="UNAUTHENTICATED"):
                await call
    assert not (tmp_path / "pwned").exists()


async def test_kill_ends_a_running_exec(client: SidecarClient) -> None:
    started = time.monotonic()
    async with contextlib.aclosing(client.exec_stream(["sh", "-c", "echo started; sleep 300"])) as stream:
        assert await anext(stream) == ("stdout", b"started\n")
        assert await client.kill() == 1
        rest = [item async for item in stream]
    assert rest == [ExecExit(exit_code=-9, timed_out=False)]
    assert time.monotonic() - started < 10
    assert await client.kill() == 0


async def test_closing_exec_stream_early_kills_the_process_group(client: SidecarClient) -> None:
    async with contextlib.aclosing(client.exec_stream(["sh", "-c", "sleep 300 & echo $!; wait"])) as stream:
        first = await anext(stream)
        assert isinstance(first, tuple) and first[0] == "stdout"
        grandchild = int(first[1])
    assert await wait_gone(grandchild), f"the background sleep {grandchild} survived closing the stream"


async def test_cancelling_exec_kills_the_process_group(client: SidecarClient, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    run = asyncio.create_task(client.exec(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.02)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    grandchild = int(pid_file.read_text())
    assert await wait_gone(grandchild), f"the background sleep {grandchild} survived the cancellation"


async def test_sigterm_kills_running_commands(client: SidecarClient, sidecar: RunningSidecar) -> None:
    async with contextlib.aclosing(client.exec_stream(["sh", "-c", "sleep 300 & echo $!; wait"])) as stream:
        first = await anext(stream)
        assert isinstance(first, tuple)
        grandchild = int(first[1])
        assert sidecar.stop() == 0
        assert await wait_gone(grandchild), f"the background sleep {grandchild} survived the sidecar"
        # The stop's grace period lets the killed command's stream end with its exit.
        assert [item async for item in stream] == [ExecExit(exit_code=-9, timed_out=False)]


@pytest.mark.spawns
def test_sidecar_refuses_to_start_without_a_token(short_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REROLL_SIDECAR_TOKEN"}
    completed = subprocess.run(
        [sys.executable, "-m", "reroll_sidecar", "--listen", f"unix:{short_dir}/s.sock"],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert completed.returncode != 0
    assert b"REROLL_SIDECAR_TOKEN" in completed.stderr
    assert not (short_dir / "s.sock").exists()


async def test_tcp_listen_on_port_zero(start_sidecar: StartSidecar) -> None:
    sidecar = await start_sidecar("127.0.0.1:0")
    host, port = sidecar.address.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) > 0
    assert sidecar.ready["pid"] == sidecar.process.pid
    async with connected(sidecar.address, sidecar.token) as client:
        await client.wait_ready(timeout_seconds=10)
        assert (await client.exec(["echo", "tcp"])).stdout == b"tcp\n"


async def verify_script(
    client: SidecarClient, root: Path, test_sh: str, *, keep_agent_processes: bool = False
) -> VerifyOutcome:
    """PrepareVerify for a sandbox laid out under `root`, then Verify with `test_sh` as the script."""
    for sub in ("app", "home", "verifier", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    client.layout = dataclasses.replace(client.layout, workspace=str(root / "app"), home=str(root / "home"))
    await client.prepare_verify(HardeningOptions(), {"PATH": os.environ["PATH"]})
    (root / "verifier" / "test.sh").write_text(test_sh)
    env = {"PATH": os.environ["PATH"], "LOGS": str(root / "logs")}
    run = VerifyScript(
        str(root / "verifier"),
        "test.sh",
        str(root / "logs"),
        env,
        30,
        keep_agent_processes=keep_agent_processes,
    )
    return await client.verify(run)


@pytest.mark.parametrize(
    ("write", "rewards", "error"),
    [
        ("echo 0.5 > $LOGS/reward.txt", {"reward": 0.5}, ""),
        ("""echo '{"a": 1, "b": 0.25}' > $LOGS/reward.json""", {"a": 1.0, "b": 0.25}, ""),
        ("echo 1 > $LOGS/reward.txt; echo '{}' > $LOGS/reward.json", {"reward": 1.0}, ""),
        (  # the structured form: its items and events are the controller's to read
            """echo '{"reward": 0.5, "items": {"a": 1}, "events": [], "space": "action"}' """
            "> $LOGS/reward.json",
            {"reward": 0.5},
            "",
        ),
        ("echo yes > $LOGS/reward.txt", {}, "reward.txt holds 'yes', not a number"),
        ("echo nan > $LOGS/reward.txt", {}, "reward.txt holds nan, not a finite number"),
        ("echo '[1]' > $LOGS/reward.json", {}, "reward.json must be an object of numbers"),
        ("""echo '{"a": true}' > $LOGS/reward.json""", {}, "reward.json must be an object of numbers"),
        ("echo '{' > $LOGS/reward.json", {}, "reward.json is not valid JSON"),
        ("echo 'no reward'", {}, "the verifier wrote neither .*/logs/reward.txt nor reward.json"),
    ],
)
async def test_verify_reads_and_checks_the_reward_file(
    client: SidecarClient, tmp_path: Path, write: str, rewards: dict[str, float], error: str
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "reward.txt").write_text("1\n")  # an old one (or the agent's): deleted first
    outcome = await verify_script(client, tmp_path, f"#!/bin/sh\n{write}\n")
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert outcome.rewards == rewards
    assert re.match(error, outcome.reward_error) if error else outcome.reward_error == ""
    if outcome.reward_file:
        assert outcome.reward_content == (tmp_path / "logs" / outcome.reward_file).read_bytes()


async def test_verify_streams_the_script_output_and_runs_scripts_without_a_shebang(
    client: SidecarClient, tmp_path: Path
) -> None:
    seen: list[tuple[str, bytes]] = []
    outcome = await verify_script(client, tmp_path, "echo out; echo err >&2; pwd; exit 3\n")
    assert outcome.stdout.decode().splitlines() == ["out", str(tmp_path / "verifier")]
    assert (outcome.stderr, outcome.exit_code) == (b"err\n", 3)
    assert outcome.hardening.killed_groups == 0
    outcome = await client.verify(
        VerifyScript(str(tmp_path / "verifier"), "test.sh", str(tmp_path / "logs"), {}, timeout_seconds=30),
        on_output=lambda name, chunk: seen.append((name, chunk)),
    )
    streamed = {
        name: b"".join(chunk for kind, chunk in seen if kind == name) for name in ("stdout", "stderr")
    }
    assert streamed == {"stdout": outcome.stdout, "stderr": b"err\n"} and outcome.stdout.startswith(b"out\n")


async def test_verify_of_a_missing_script_raises_file_not_found(
    client: SidecarClient, tmp_path: Path
) -> None:
    await verify_script(client, tmp_path, "exit 0\n")
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"test script {tmp_path}/verifier/absent.sh is missing")
    ):
        await client.verify(
            VerifyScript(
                str(tmp_path / "verifier"), "absent.sh", str(tmp_path / "logs"), {}, timeout_seconds=30
            )
        )


async def test_verify_requests_need_absolute_paths(client: SidecarClient, tmp_path: Path) -> None:
    with pytest.raises(SidecarError, match=r"INVALID_ARGUMENT.*workspace must be an absolute path"):
        client.layout = dataclasses.replace(client.layout, workspace="app", home=str(tmp_path))
        await client.prepare_verify(HardeningOptions(), {})
    await verify_script(client, tmp_path, "exit 0\n")
    with pytest.raises(SidecarError, match=r"INVALID_ARGUMENT.*reward_dir must be an absolute path"):
        await client.verify(
            VerifyScript(str(tmp_path / "verifier"), "test.sh", "logs", {}, timeout_seconds=1)
        )


async def test_snapshot_rpc_reports_size_and_method_and_restore_its_paths(
    client: SidecarClient, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "file").write_text("saved")
    # The raw RPC: SidecarClient.snapshot returns the size only.
    request = pb.SnapshotRequest(name="s", paths=[str(tmp_path / "ws")])
    response = await client._rpc.Snapshot(request, metadata=client._metadata)
    assert response.method in ("tar", "tar+reflink") and response.size_bytes > 0
    (tmp_path / "ws" / "file").write_text("changed")
    assert await client.restore("s") == [str(tmp_path / "ws")]
    assert (tmp_path / "ws" / "file").read_text() == "saved"
