"""Conformance checks of prepare_verify and verify: hardening, a clean environment, timeouts."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from reroll_contracts.errors import SandboxError, VerifierError

from reroll.conformance.support import (
    BACKGROUND_SLEEP,
    ENV_TEST_SH,
    base_env,
    expect,
    expect_gone,
    expect_raises,
    probe_task,
    sh,
    started,
)
from reroll.rollout.verify.script_verifier import prepare, verify
from reroll.runfolder.paths import RunPaths, VerifierPaths
from reroll.sandbox.base import Sandbox, SandboxFactory

PLANT_SCRIPT = (
    "printf '[tool.pytest.ini_options]\\naddopts = \"-p cheat\"\\n' > pyproject.toml && "
    "echo 'import os' > sitecustomize.py && mkdir -p deep/er && echo x > deep/er/conftest.py && "
    "mkdir -p $HOME/.local/lib && echo 'import os' > $HOME/.local/lib/cheat.pth"
)
"""Run as the agent in the workspace: a build-config file and start-up hooks the baseline lacks."""


async def planted(sandbox: Sandbox) -> list[str]:
    """The files PLANT_SCRIPT creates that still exist (absolute paths in the sandbox)."""
    workspace, home = sandbox.layout.workspace, sandbox.layout.home
    candidates = [
        f"{workspace}/pyproject.toml",
        f"{workspace}/sitecustomize.py",
        f"{workspace}/deep/er/conftest.py",
        f"{home}/.local/lib/cheat.pth",
    ]
    found = []
    for path in candidates:
        with contextlib.suppress(FileNotFoundError):
            await sandbox.get_file(path)
            found.append(path)
    return found


def script_env(output_dir: Path) -> dict[str, str]:
    """The environment ENV_TEST_SH printed, with ``user`` for who ran it."""
    lines = VerifierPaths(output_dir).stdout.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


async def check_verify_scores_the_workspace_and_undoes_planted_hooks(
    factory: SandboxFactory, workdir: Path
) -> None:
    """prepare_verify + verify: reward read, planted build config and hooks undone, agent killed."""
    task = probe_task(workdir / "task")
    async with started(factory, task) as sandbox:
        env = base_env(sandbox)
        workspace, user = sandbox.layout.workspace, sandbox.layout.agent_user
        await sh(sandbox, "echo 'import os' > conftest.py && echo 'keep = 1' > setup.cfg", user=user, env=env)
        baseline = await prepare(sandbox, task, env)
        expect(
            f"{workspace}/conftest.py" in baseline.hooks, f"the task's conftest.py not in {baseline.hooks}"
        )
        expect(
            f"{workspace}/setup.cfg" in baseline.snapshot_paths, f"setup.cfg not in {baseline.snapshot_paths}"
        )
        await sh(
            sandbox, "printf 'Hello, reroll!\\n' > hello.txt && echo 'gamed' > setup.cfg", user=user, env=env
        )
        await sh(sandbox, f"{PLANT_SCRIPT} && echo 'import sys' > conftest.py", user=user, env=env)
        await sh(sandbox, BACKGROUND_SLEEP, user=user, env=env)
        output = RunPaths(workdir).verifier
        verdict = await verify(sandbox, task, env, output.root)
        expect(verdict.rewards == {"reward": 1.0}, f"rewards {verdict.rewards}")
        expect(output.reward("reward.txt").read_text() == "1\n", "reward.txt not copied out")
        report = json.loads(output.hardening.read_text())
        injected = [
            f"{workspace}/sitecustomize.py",
            f"{workspace}/deep/er/conftest.py",
            f"{sandbox.layout.home}/.local/lib/cheat.pth",
        ]
        expect(sorted(report["deleted"]) == sorted(injected), f"hardening deleted {report['deleted']}")
        expect(
            f"{workspace}/pyproject.toml" in report["restored"], f"hardening restored {report['restored']}"
        )
        expect(await planted(sandbox) == [], f"planted files survived: {await planted(sandbox)}")
        expect(await sandbox.get_file(f"{workspace}/setup.cfg") == b"keep = 1\n", "setup.cfg not restored")
        expect(
            await sandbox.get_file(f"{workspace}/conftest.py") == b"import os\n", "conftest.py not restored"
        )
        await expect_gone(sandbox, "the agent's background process after verification")
        await sh(sandbox, "rm hello.txt")
        again = await verify(sandbox, task, env, workdir / "again")
        expect(again.rewards == {"reward": 0.0}, f"rewards {again.rewards} without hello.txt")


async def check_verify_runs_the_script_in_a_clean_environment(factory: SandboxFactory, workdir: Path) -> None:
    """verify: the script's environment is cleaned and hardened; in a container it runs as root."""
    task = probe_task(workdir / "task", ENV_TEST_SH, {"pytest_plugins": ["myplugin"]})
    async with started(factory, task) as sandbox:
        env = base_env(sandbox)
        await prepare(sandbox, task, env)
        polluted = {**env, "PYTHONPATH": "/evil", "PYTHONHOME": "/evil", "PYTEST_ADDOPTS": "-p evil"}
        await verify(sandbox, task, polluted, workdir / "out")
        seen = script_env(workdir / "out")
        verifier_dir = sandbox.layout.path("verifier")
        expect(
            "PYTHONPATH" not in seen and "PYTHONHOME" not in seen, "PYTHONPATH/PYTHONHOME reached the script"
        )
        expect(seen["PATH"] == env["PATH"], f"PATH {seen['PATH']}")
        rootdir = sandbox.layout.workspace  # where the script runs (the image's WORKDIR), as BenchFlow
        addopts = f"-c /dev/null --rootdir={rootdir} --confcutdir={verifier_dir} -p no:cacheprovider -p "
        # Then the declared plugin (beside the image's trusted ones), then the options of the
        # sidecar's own pytest report (--junitxml, --log-file).
        expect(
            seen["PYTEST_ADDOPTS"].startswith(addopts) and " -p myplugin " in seen["PYTEST_ADDOPTS"],
            f"PYTEST_ADDOPTS {seen['PYTEST_ADDOPTS']!r}",
        )
        expect(
            seen["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" and seen["PYTHONNOUSERSITE"] == "1",
            "plugin autoload or the user site left on",
        )
        expect(
            seen["REROLL_VERIFIER_DIR"] == verifier_dir, f"REROLL_VERIFIER_DIR {seen['REROLL_VERIFIER_DIR']}"
        )
        if sandbox.layout.agent_user:  # the agent has a user of its own: the script runs as root
            expect(
                seen["user"] == "root" and seen["HOME"] == "/root", f"ran as {seen['user']} in {seen['HOME']}"
            )


async def check_verify_honours_the_tasks_opt_outs(factory: SandboxFactory, workdir: Path) -> None:
    """verify with every hardening step a task may switch off switched off; killing has no opt-out."""
    off = {
        "restore_build_config": False,
        "delete_injected_hooks": False,
        "pytest_addopts": False,
        "plugin_autoload": True,
    }
    task = probe_task(workdir / "task", ENV_TEST_SH, {"hardening": off})
    async with started(factory, task) as sandbox:
        env = base_env(sandbox)
        baseline = await prepare(sandbox, task, env)
        expect(baseline.hooks == [] and baseline.snapshot_paths == [], f"baseline {baseline}")
        await sh(sandbox, PLANT_SCRIPT, user=sandbox.layout.agent_user, env=env)
        await sh(sandbox, BACKGROUND_SLEEP, user=sandbox.layout.agent_user)
        await verify(sandbox, task, env, workdir / "out")
        report = json.loads(VerifierPaths(workdir / "out").hardening.read_text())
        expect(report["restored"] == [] and report["deleted"] == [], f"opted out, yet hardening did {report}")
        expect(len(await planted(sandbox)) == 4, "opted out, yet planted files were removed")
        seen = script_env(workdir / "out")
        expect(
            "PYTEST_ADDOPTS" not in seen and "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in seen,
            "opted out, yet the pytest variables were set",
        )
        await expect_gone(sandbox, "the agent's background process after verification")


SLEEP_299_ALIVE = """
for _ in $(seq 50); do
  grep -qs '^sleep.299' /proc/[0-9]*/cmdline 2>/dev/null || exit 1
  sleep 0.1
done
"""
"""Exits 0 while a ``sleep 299`` runs in the sandbox for 5 s on end (its cmdline's NULs: any byte)."""


async def check_verify_timeout_kills_the_scripts_process_group(
    factory: SandboxFactory, workdir: Path
) -> None:
    """verify's timeout: VerifierError saying so, and the script's background children killed."""
    # the child is found by its command line, not its pid: a verify may run in a PID namespace
    # of its own (the sidecar's verify_ns), whose pids mean nothing in the sandbox's
    test_sh = "#!/bin/sh\nsleep 299 &\nsleep 300\n"
    task = probe_task(workdir / "task", test_sh, {"timeout_sec": 1})
    async with started(factory, task) as sandbox:
        env = base_env(sandbox)
        await prepare(sandbox, task, env)
        with expect_raises(VerifierError, "verifier timed out after 1 s"):
            await verify(sandbox, task, env, workdir / "out")
        found = await sandbox.exec(["sh", "-c", SLEEP_299_ALIVE], cwd=sandbox.layout.workspace)
        expect(found.exit_code != 0, "the test script's background child after its timeout still runs")


async def check_verify_names_a_missing_test_script(factory: SandboxFactory, workdir: Path) -> None:
    """verify when test.sh vanished after the task loaded: VerifierError naming it."""
    task = probe_task(workdir / "task", ENV_TEST_SH)
    async with started(factory, task) as sandbox:
        env = base_env(sandbox)
        await prepare(sandbox, task, env)
        (task.verifier_dir / "test.sh").unlink()
        script = sandbox.layout.path("verifier/test.sh")
        with expect_raises(VerifierError, re.escape(f"test script {script} is missing")):
            await verify(sandbox, task, env, workdir / "out")


async def check_verify_without_prepare_fails_clearly(factory: SandboxFactory, workdir: Path) -> None:
    """verify without prepare_verify before: SandboxError saying prepare must come first."""
    task = probe_task(workdir / "task")
    async with started(factory, task) as sandbox:
        with expect_raises(SandboxError, "PrepareVerify must run before the agent"):
            await verify(sandbox, task, base_env(sandbox), workdir / "out")
