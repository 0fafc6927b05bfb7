"""Conformance checks of the lifecycle, exec, kill and files."""

from __future__ import annotations

from pathlib import Path

from reroll_contracts.errors import SandboxError

from reroll.conformance.support import (
    BACKGROUND_SLEEP,
    SEED_FILE,
    expect,
    expect_gone,
    expect_raises,
    probe_task,
    sh,
    started,
)
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.base import SandboxFactory


async def check_exec_streams_output_exit_code_and_environment(factory: SandboxFactory, workdir: Path) -> None:
    """exec: exit code, stdout and stderr apart, cwd, env, and every chunk passed to on_output."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        chunks: list[tuple[str, bytes]] = []
        result = await sandbox.exec(
            ["sh", "-c", 'echo "out $REROLL_TEST"; echo err >&2; pwd; exit 3'],
            cwd=sandbox.layout.workspace,
            env={"REROLL_TEST": "value"},
            on_output=lambda name, chunk: chunks.append((name, chunk)),
        )
        expect(result.exit_code == 3 and not result.timed_out, f"exit {result.exit_code}, not 3")
        lines = result.stdout.decode().splitlines()
        expect(lines == ["out value", sandbox.layout.workspace], f"stdout {lines}")
        expect(result.stderr == b"err\n", f"stderr {result.stderr!r}")
        streamed = {
            name: b"".join(chunk for kind, chunk in chunks if kind == name) for name in ("stdout", "stderr")
        }
        expect(
            streamed == {"stdout": result.stdout, "stderr": result.stderr},
            f"on_output saw {streamed}, the result holds {result.stdout!r} / {result.stderr!r}",
        )
        stdin = await sandbox.exec(["cat"], stdin=b"fed")
        expect(stdin.stdout == b"fed", f"stdin not fed: {stdin.stdout!r}")


async def check_exec_of_a_missing_program_ends_with_127(factory: SandboxFactory, workdir: Path) -> None:
    """exec of a program that does not exist: exit code 127, the name on stderr."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        result = await sandbox.exec(["no-such-program-reroll"])
        expect(
            result.exit_code == 127 and b"no-such-program-reroll" in result.stderr,
            f"exit {result.exit_code}, stderr {result.stderr!r}",
        )


async def check_timeout_kills_the_whole_process_group(factory: SandboxFactory, workdir: Path) -> None:
    """exec's timeout: exit -9, timed_out, and the command's background children killed too."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        script = "sleep 300 & echo $! > bg.pid; sleep 300"
        result = await sandbox.exec(["sh", "-c", script], cwd=sandbox.layout.workspace, timeout_seconds=1)
        expect(
            result.timed_out and result.exit_code == -9,
            f"exit {result.exit_code}, timed out {result.timed_out}",
        )
        expect(result.duration_seconds < 10, f"a 1 s timeout took {result.duration_seconds:.1f} s")
        await expect_gone(sandbox, "the background child of a timed-out command")


async def check_kill_ends_what_exec_started(factory: SandboxFactory, workdir: Path) -> None:
    """kill: the process groups exec started (and their background children) die."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        await sh(sandbox, BACKGROUND_SLEEP, user=sandbox.layout.agent_user)
        killed = await sandbox.kill()
        expect(killed >= 1, f"kill reported {killed} process groups")
        await expect_gone(sandbox, "a background process after kill")


async def check_the_agent_user_runs_commands_in_a_writable_workspace(
    factory: SandboxFactory, workdir: Path
) -> None:
    """exec as ``layout.agent_user``: runs as that user and may write the workspace, seeded from the task."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        user = sandbox.layout.agent_user
        out = await sh(sandbox, f"id -un; touch mine && cat {SEED_FILE}", user=user, env=sandbox.layout.env())
        name, *seed = out.splitlines()
        expect(name == user or not user, f"ran as {name}, not {user}")
        expect(seed == ["the probe task's workspace"], f"the workspace was not seeded: {seed}")


async def check_files_round_trip_with_modes(factory: SandboxFactory, workdir: Path) -> None:
    """put_file / get_file (whole, or its start) / upload_dir: bytes and modes kept; a missing file
    is FileNotFoundError."""
    async with started(factory, probe_task(workdir / "task")) as sandbox:
        path = f"{sandbox.layout.workspace}/sub/dir/run.sh"
        data = bytes(range(256)) * 5000  # > 1 MiB
        written = await sandbox.put_file(path, data, mode=0o750)
        expect(written == len(data), f"put_file reported {written} bytes, not {len(data)}")
        expect(await sandbox.get_file(path) == data, "get_file returned other bytes than put_file wrote")
        start = await sandbox.get_file(path, max_bytes=1_100_000)  # over one 1 MiB chunk, not all
        expect(start == data[:1_100_000], f"get_file(max_bytes=1100000) returned {len(start)} other bytes")
        mode = (await sh(sandbox, f"stat -c %a {path}")).strip()
        expect(mode == "750", f"mode {mode}, not 750")
        with expect_raises(FileNotFoundError, r"missing\.txt"):
            await sandbox.get_file(f"{sandbox.layout.workspace}/missing.txt")
        source = workdir / "upload"
        (source / "deep").mkdir(parents=True)
        (source / "top.txt").write_text("top")
        (source / "deep" / "run.sh").write_text("#!/bin/sh\n")
        (source / "deep" / "run.sh").chmod(0o755)
        destination = f"{sandbox.layout.workspace}/uploaded"
        expect(await sandbox.upload_dir(source, destination) == 2, "upload_dir did not count 2 files")
        expect(await sandbox.get_file(f"{destination}/top.txt") == b"top", "upload_dir lost top.txt")
        mode = (await sh(sandbox, f"stat -c %a {destination}/deep/run.sh")).strip()
        expect(mode == "755", f"upload_dir made run.sh mode {mode}, not 755")


async def check_lifecycle(factory: SandboxFactory, workdir: Path) -> None:
    """Before start: host_address answers, everything else refuses with "not started", stop is
    safe. Started: exec works, egress yields an environment. After stop (twice): refuses again."""
    task = probe_task(workdir / "task")
    unstarted = factory(sandbox_spec(task), "never-started")
    expect(bool(await unstarted.host_address()), "host_address is empty before start")
    with expect_raises(SandboxError, "not started"):
        await unstarted.exec(["true"])
    await unstarted.stop()  # safe on a sandbox that never started
    async with started(factory, task) as sandbox:
        expect((await sandbox.exec(["true"])).exit_code == 0, "`true` failed")
        async with sandbox.egress() as env:
            expect(isinstance(env, dict), f"egress yielded {env!r}, not a dict")
        await sh(sandbox, BACKGROUND_SLEEP)
    await sandbox.stop()  # a second stop is fine
    with expect_raises(SandboxError, "not started"):
        await sandbox.get_file(f"{sandbox.layout.workspace}/bg.pid")


async def check_a_long_run_name_still_starts(factory: SandboxFactory, workdir: Path) -> None:
    """Job rollouts have long run ids (task, agent, model, repeat): a 200-character one must work
    (a Unix socket's path, for one, may hold only 107 bytes)."""
    async with started(factory, probe_task(workdir / "task"), "x" * 200) as sandbox:
        expect((await sandbox.exec(["true"])).exit_code == 0, "`true` failed")
