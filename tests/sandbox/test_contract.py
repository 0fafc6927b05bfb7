"""The sandbox contract: what every backend must do, run against `local` and a real Docker engine."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path

import pytest
from reroll.errors import SandboxError, VerifierError
from reroll.rollout import sandbox_env
from reroll.sandbox.base import Sandbox, create_sandbox
from reroll.sandbox.sidecar_client import SidecarError
from reroll.tasks import Task, load_task
from reroll.verify import prepare, verify

from tests.conftest import labelled_containers

# Prints {relative path: [type, mode, content or link target]} of a tree, run inside the sandbox.
TREE_SCRIPT = r"""
import json, os, stat, sys
root = sys.argv[1]
out = {}
for base, dirs, files in os.walk(root):
    for name in sorted(dirs + files):
        full = os.path.join(base, name)
        st = os.lstat(full)
        rel = os.path.relpath(full, root)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ["link", 0, os.readlink(full)]
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ["dir", stat.S_IMODE(st.st_mode), ""]
        else:
            out[rel] = ["file", stat.S_IMODE(st.st_mode), open(full, "rb").read().decode("latin-1")]
json.dump(out, sys.stdout, sort_keys=True)
"""


ALIVE_SCRIPT = """
for _ in $(seq 50); do
  state=$(cut -d' ' -f3 /proc/$(cat bg.pid)/stat 2>/dev/null)
  if [ -z "$state" ] || [ "$state" = Z ]; then exit 1; fi
  sleep 0.1
done
"""
"""Exits 0 while the process in bg.pid still runs after 5 s, 1 once it is gone or a zombie."""


async def sh(sandbox: Sandbox, script: str, **kwargs: object) -> str:
    """Run `script` with sh in the workspace; assert it succeeded; return its stdout."""
    result = await sandbox.client.exec(["sh", "-c", script], cwd=sandbox.layout.workspace, **kwargs)  # type: ignore[arg-type]
    assert result.exit_code == 0, result.output_text()
    return result.stdout.decode()


async def tree(sandbox: Sandbox, root: str) -> dict[str, list[object]]:
    return json.loads(await sh(sandbox, f"python3 -c '{TREE_SCRIPT}' {root}"))


async def test_exec_streams_output_exit_code_and_environment(sandbox: Sandbox) -> None:
    result = await sandbox.client.exec(
        ["sh", "-c", 'echo "out $REROLL_TEST"; echo err >&2; pwd; exit 3'],
        cwd=sandbox.layout.workspace,
        env={"REROLL_TEST": "value"},
    )
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout.decode().splitlines() == ["out value", sandbox.layout.workspace]
    assert result.stderr == b"err\n"


async def test_exec_of_a_missing_program_ends_with_127(sandbox: Sandbox) -> None:
    result = await sandbox.client.exec(["no-such-program-reroll"])
    assert result.exit_code == 127 and b"no-such-program-reroll" in result.stderr


async def test_timeout_kills_the_whole_process_group(sandbox: Sandbox) -> None:
    script = "sleep 300 & echo $! > bg.pid; sleep 300"
    result = await sandbox.client.exec(["sh", "-c", script], cwd=sandbox.layout.workspace, timeout_seconds=1)
    assert result.timed_out and result.exit_code == -9
    assert result.duration_seconds < 10
    # Gone, or a zombie waiting for its reaper (killed all the same); polled for up to 5 s.
    alive = await sandbox.client.exec(["sh", "-c", ALIVE_SCRIPT], cwd=sandbox.layout.workspace)
    assert alive.exit_code != 0, "the background child of a timed-out command still runs"


async def test_the_agent_user_runs_commands_in_a_writable_workspace(sandbox: Sandbox) -> None:
    user = sandbox.layout.agent_user
    out = await sh(sandbox, "id -un; touch mine && echo ok", user=user, env=sandbox.layout.env())
    name, ok = out.split()
    assert ok == "ok" and (name == user or not user)


async def test_files_round_trip_with_modes(sandbox: Sandbox) -> None:
    path = f"{sandbox.layout.workspace}/sub/dir/run.sh"
    data = bytes(range(256)) * 5000  # > 1 MiB: several chunks
    assert await sandbox.client.put_file(path, data, mode=0o750) == len(data)
    assert await sandbox.client.get_file(path) == data
    assert (await sh(sandbox, f"stat -c %a {path}")).strip() == "750"
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        await sandbox.client.get_file(f"{sandbox.layout.workspace}/missing.txt")


async def test_restore_puts_back_contents_modes_symlinks_and_deletions(sandbox: Sandbox) -> None:
    workspace = sandbox.layout.workspace
    await sh(
        sandbox,
        "mkdir -p pkg/deep && printf 'one' > pkg/a.txt && printf 'two' > pkg/deep/b.txt && "
        "printf 'x' > run.sh && chmod 755 run.sh && chmod 700 pkg/deep && ln -s pkg/a.txt link && "
        "printf 'gone later' > doomed.txt && printf 'abc' > same.txt && touch -d 2001-01-01 same.txt",
    )
    before = await tree(sandbox, workspace)
    assert before["link"] == ["link", 0, "pkg/a.txt"] and before["run.sh"][1] == 0o755
    assert await sandbox.snapshot("before") > 0
    await sh(
        sandbox,
        "printf 'changed' > pkg/a.txt && chmod 600 run.sh && rm doomed.txt && rm -r pkg/deep && "
        "rm link && ln -s run.sh link && printf 'new' > added.txt && mkdir newdir && "
        "printf 'xyz' > same.txt && touch -d 2001-01-01 same.txt",  # same size and mtime, new content
    )
    assert await tree(sandbox, workspace) != before
    assert await sandbox.restore("before") == [workspace]
    assert await tree(sandbox, workspace) == before


# Prints {relative path: [type, mode, uid, gid, mtime (s), nlink, content or target]} and the
# groups of names sharing an inode, run inside the sandbox.
FULL_TREE_SCRIPT = r"""
import json, os, stat, sys
root = sys.argv[1]
out, inodes = {}, {}
for base, dirs, files in os.walk(root):
    for name in dirs + files:
        full = os.path.join(base, name)
        st = os.lstat(full)
        rel = os.path.relpath(full, root)
        if stat.S_ISLNK(st.st_mode):
            body = os.readlink(full)
        elif not stat.S_ISREG(st.st_mode):
            body = ""
        else:
            body = open(full, "rb").read().decode("latin-1")
            inodes.setdefault(st.st_ino, []).append(rel)
        out[rel] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                    int(st.st_mtime), st.st_nlink, body]
out[".root"] = [stat.S_IMODE(os.lstat(root).st_mode), int(os.lstat(root).st_mtime)]
out[".links"] = sorted(sorted(names) for names in inodes.values() if len(names) > 1)
json.dump(out, sys.stdout, sort_keys=True)
"""

HARD_CASES_BEFORE = r"""
mkdir -p d2f/sub gone/deeper f2d.parent && printf in > d2f/sub/x && printf f > f2d && printf g > gone/deeper/y
printf p > perm && chmod 640 perm && printf s > f2l && ln -s perm l2f && printf o > owned
printf h > hard && ln hard hard2 && head -c 300000 /dev/urandom > big && chmod 604 big
printf keep > same && printf sp > 'sp ace' && printf bs > 'back\slash' && printf d > ./-dash
mkdir -p "$(printf 'n%.0s' $(seq 60))/$(printf 'm%.0s' $(seq 60))" && printf deep > n*/m*/file
mkdir quiet && printf a > quiet/inplace
touch -d 2001-01-01 gone same d2f/sub quiet && chmod 750 gone/deeper
"""
"""Every kind of entry restore must get right, made in the workspace."""

HARD_CASES_CHANGES = r"""
rm -r d2f && printf now-a-file > d2f && rm f2d && mkdir f2d && printf z > f2d/z && rm -r gone
chmod 600 perm && rm f2l && ln -s perm f2l && rm l2f && printf real > l2f
if [ "$(id -u)" = 0 ]; then chown 65534:65534 owned; else chmod 604 owned; fi
printf b > quiet/inplace && printf H > hard && printf X | dd of=big bs=1 seek=1000 conv=notrunc 2>/dev/null
printf new > 'sp ace' && rm 'back\slash' ./-dash && rm -r n*/m* && ln -s / escape && mkfifo fifo
"""
"""Type changes both ways, a deleted folder, permission- and owner-only changes, files replaced by
symlinks and back, hard links edited in place, a file edited in place in an otherwise untouched
folder, a large file edited in place, odd and long names, a new fifo."""


async def check_hard_cases(sandbox: Sandbox) -> None:
    """Snapshot a tree of HARD_CASES_BEFORE, apply HARD_CASES_CHANGES, restore, compare; twice."""
    workspace = sandbox.layout.workspace
    await sh(sandbox, HARD_CASES_BEFORE)
    # Older than the snapshot's start (entries changed while it runs are always put back): this
    # way restore must tell changed entries from unchanged ones by their stamps.
    await asyncio.sleep(0.3)
    full_tree = f"python3 -c '{FULL_TREE_SCRIPT}' {workspace}"
    before = json.loads(await sh(sandbox, full_tree))
    assert before[".links"] == [["hard", "hard2"]]
    same_inode = await sh(sandbox, "stat -c %i same")
    await sandbox.snapshot("hard")
    for round_trip in ("first", "second"):
        await sh(sandbox, HARD_CASES_CHANGES)
        assert json.loads(await sh(sandbox, full_tree)) != before
        assert await sandbox.restore("hard") == [workspace]
        assert json.loads(await sh(sandbox, full_tree)) == before, f"{round_trip} restore"
    assert await sh(sandbox, "stat -c %i same") == same_inode, "an unchanged file was rewritten"


async def test_restore_gets_type_owner_and_permission_changes_links_and_names_right(
    sandbox: Sandbox,
) -> None:
    await check_hard_cases(sandbox)


async def test_snapshot_of_named_paths_records_absent_ones(sandbox: Sandbox) -> None:
    workspace = sandbox.layout.workspace
    keep, absent = f"{workspace}/keep.txt", f"{workspace}/absent.txt"
    await sh(sandbox, "printf 'kept' > keep.txt && printf 'other' > other.txt")
    await sandbox.snapshot("named", [keep, absent])
    await sh(
        sandbox, "printf 'changed' > keep.txt && printf 'created' > absent.txt && printf 'x' > other.txt"
    )
    assert await sandbox.restore("named") == [keep, absent]
    assert await sandbox.client.get_file(keep) == b"kept"
    with pytest.raises(FileNotFoundError):
        await sandbox.client.get_file(absent)
    assert await sandbox.client.get_file(f"{workspace}/other.txt") == b"x", "outside the snapshot: untouched"
    await sandbox.snapshot("nothing-yet", [absent])
    await sh(sandbox, "printf 'created' > absent.txt")
    await sandbox.restore("nothing-yet")
    with pytest.raises(FileNotFoundError):
        await sandbox.client.get_file(absent)


async def test_restore_of_an_unknown_snapshot_or_bad_name_fails_clearly(sandbox: Sandbox) -> None:
    with pytest.raises(SidecarError, match=r"NOT_FOUND.*no snapshot named 'never'"):
        await sandbox.restore("never")
    with pytest.raises(SidecarError, match=r"INVALID_ARGUMENT.*snapshot name"):
        await sandbox.snapshot("../escape")


ENV_TEST_SH = """#!/bin/sh
# Prints who runs it and its environment; reward 1.
echo "user=$(id -un)"
env
echo 1 > "${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
"""

PLANT_SCRIPT = (
    "printf '[tool.pytest.ini_options]\\naddopts = \"-p cheat\"\\n' > pyproject.toml && "
    "echo 'import os' > sitecustomize.py && mkdir -p deep/er && echo x > deep/er/conftest.py && "
    "mkdir -p $HOME/.local/lib && echo 'import os' > $HOME/.local/lib/cheat.pth"
)
"""Run as the agent in the workspace: a build-config file and start-up hooks the baseline lacks."""


def make_task(root: Path, test_sh: str, verifier: dict[str, object] | None = None) -> Task:
    """A task in `root` whose verifier runs `test_sh`, with the `verifier` section given."""
    front = {"name": "probe", "verifier": {"timeout_sec": 30, **(verifier or {})}}
    (root / "verifier").mkdir(parents=True)
    (root / "task.md").write_text(f"---\n{json.dumps(front)}\n---\nProbe the verifier.\n")
    (root / "verifier" / "test.sh").write_text(test_sh)
    return load_task(root)


def script_env(output_dir: Path) -> dict[str, str]:
    """The environment the test script printed (ENV_TEST_SH), with ``user`` for who ran it."""
    lines = (output_dir / "test-stdout.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


async def planted(sandbox: Sandbox) -> list[str]:
    """The files PLANT_SCRIPT creates that still exist (paths relative to the sandbox)."""
    workspace, home = sandbox.layout.workspace, sandbox.layout.home
    candidates = [
        f"{workspace}/pyproject.toml",
        f"{workspace}/sitecustomize.py",
        f"{workspace}/deep/er/conftest.py",
        f"{home}/.local/lib/cheat.pth",
    ]
    found = []
    for path in candidates:
        try:
            await sandbox.client.get_file(path)
        except FileNotFoundError:
            continue
        found.append(path)
    return found


async def test_verify_scores_the_workspace_and_undoes_planted_hooks(
    sandbox: Sandbox, task: Task, tmp_path: Path
) -> None:
    env = sandbox_env(sandbox)
    agent = {"user": sandbox.layout.agent_user, "env": env}
    await sh(sandbox, "echo 'import os' > conftest.py && echo 'keep = 1' > setup.cfg", **agent)  # the task's
    baseline = await prepare(sandbox, task, env)
    workspace = sandbox.layout.workspace
    assert f"{workspace}/conftest.py" in baseline.hooks
    assert f"{workspace}/setup.cfg" in baseline.snapshot_paths
    await sh(sandbox, "printf 'Hello, reroll!\\n' > hello.txt && echo 'gamed' > setup.cfg", **agent)
    await sh(sandbox, f"{PLANT_SCRIPT} && echo 'import sys' > conftest.py", **agent)
    await sh(sandbox, "nohup sleep 300 >/dev/null 2>&1 & echo $! > bg.pid", **agent)
    verdict = await verify(sandbox, task, env, tmp_path / "verifier")
    assert verdict.rewards == {"reward": 1.0}
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "1\n"
    report = json.loads((tmp_path / "verifier" / "hardening.json").read_text())
    assert sorted(report["deleted"]) == sorted(
        [
            f"{workspace}/sitecustomize.py",
            f"{workspace}/deep/er/conftest.py",
            f"{sandbox.layout.home}/.local/lib/cheat.pth",
        ]
    )
    assert f"{workspace}/pyproject.toml" in report["restored"] and report["killed_groups"] >= 1
    assert await planted(sandbox) == []
    assert await sandbox.client.get_file(f"{workspace}/setup.cfg") == b"keep = 1\n"
    assert await sandbox.client.get_file(f"{workspace}/conftest.py") == b"import os\n", "restored"
    alive = await sandbox.client.exec(["sh", "-c", ALIVE_SCRIPT], cwd=workspace)
    assert alive.exit_code != 0, "the agent's background process survived verification"
    await sh(sandbox, "rm hello.txt")
    assert (await verify(sandbox, task, env, tmp_path / "again")).rewards == {"reward": 0.0}


async def test_verify_runs_the_script_in_a_clean_environment(sandbox: Sandbox, tmp_path: Path) -> None:
    task = make_task(tmp_path / "task", ENV_TEST_SH, {"hardening": {"pytest_plugins": ["myplugin"]}})
    env = sandbox_env(sandbox)
    await prepare(sandbox, task, env)
    polluted = {**env, "PYTHONPATH": "/evil", "PYTHONHOME": "/evil", "PYTEST_ADDOPTS": "-p evil"}
    await verify(sandbox, task, polluted, tmp_path / "out")
    seen = script_env(tmp_path / "out")
    verifier_dir = sandbox.layout.path("verifier")
    assert "PYTHONPATH" not in seen and "PYTHONHOME" not in seen
    assert seen["PATH"] == env["PATH"]
    assert (
        seen["PYTEST_ADDOPTS"] == f"-c /dev/null --confcutdir={verifier_dir} -p no:cacheprovider -p myplugin"
    )
    assert seen["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" and seen["PYTHONNOUSERSITE"] == "1"
    assert seen["REROLL_VERIFIER_DIR"] == verifier_dir
    if sandbox.layout.agent_user:  # a container: root, not the agent, with root's HOME
        assert seen["user"] == "root" and seen["HOME"] == "/root"


async def test_verify_honours_the_tasks_opt_outs(sandbox: Sandbox, tmp_path: Path) -> None:
    off = {
        "restore_build_config": False,
        "delete_injected_hooks": False,
        "pytest_addopts": False,
        "plugin_autoload": True,
    }
    task = make_task(tmp_path / "task", ENV_TEST_SH, {"hardening": off})
    env = sandbox_env(sandbox)
    baseline = await prepare(sandbox, task, env)
    assert baseline.hooks == [] and baseline.snapshot_paths == []
    await sh(sandbox, PLANT_SCRIPT, user=sandbox.layout.agent_user, env=env)
    await sh(sandbox, "nohup sleep 300 >/dev/null 2>&1 & echo $! > bg.pid", user=sandbox.layout.agent_user)
    await verify(sandbox, task, env, tmp_path / "out")
    report = json.loads((tmp_path / "out" / "hardening.json").read_text())
    assert report["restored"] == [] and report["deleted"] == []
    assert len(await planted(sandbox)) == 4, "opted out: the planted files stay"
    seen = script_env(tmp_path / "out")
    assert "PYTEST_ADDOPTS" not in seen and "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in seen
    alive = await sandbox.client.exec(["sh", "-c", ALIVE_SCRIPT], cwd=sandbox.layout.workspace)
    assert alive.exit_code != 0, "killing the agent's processes has no opt-out"


async def test_verify_timeout_kills_the_scripts_process_group(sandbox: Sandbox, tmp_path: Path) -> None:
    test_sh = '#!/bin/sh\nsleep 300 & echo $! > "${REROLL_WORKSPACE:-/app}/bg.pid"\nsleep 300\n'
    task = make_task(tmp_path / "task", test_sh, {"timeout_sec": 1})
    env = sandbox_env(sandbox)
    await prepare(sandbox, task, env)
    with pytest.raises(VerifierError, match="verifier timed out after 1 s"):
        await verify(sandbox, task, env, tmp_path / "out")
    alive = await sandbox.client.exec(["sh", "-c", ALIVE_SCRIPT], cwd=sandbox.layout.workspace)
    assert alive.exit_code != 0, "the test script's background child survived the timeout"


async def test_verify_names_a_missing_test_script(sandbox: Sandbox, tmp_path: Path) -> None:
    task = make_task(tmp_path / "task", ENV_TEST_SH)
    env = sandbox_env(sandbox)
    await prepare(sandbox, task, env)
    (task.verifier_dir / "test.sh").unlink()  # gone after the task was loaded
    script = sandbox.layout.path("verifier/test.sh")
    with pytest.raises(VerifierError, match=re.escape(f"test script {script} is missing")):
        await verify(sandbox, task, env, tmp_path / "out")


async def test_verify_without_prepare_fails_clearly(sandbox: Sandbox, task: Task, tmp_path: Path) -> None:
    with pytest.raises(SidecarError, match=r"FAILED_PRECONDITION.*PrepareVerify must run before the agent"):
        await verify(sandbox, task, sandbox_env(sandbox), tmp_path / "out")


async def test_started_sandbox_is_ready_and_unstarted_one_refuses(
    backend: str, task: Task, sandbox: Sandbox
) -> None:
    health = await sandbox.client.health()
    assert health.ready
    unstarted = create_sandbox(backend, task, "never-started")
    with pytest.raises(SandboxError, match="not started"):
        _ = unstarted.client
    await unstarted.stop()  # safe on a sandbox that never started


async def test_stop_leaves_nothing_behind(backend: str, task: Task, run_id: str) -> None:
    sandbox = create_sandbox(backend, task, run_id)
    await sandbox.start()
    pid_file = f"{sandbox.layout.workspace}/bg.pid"
    await sh(sandbox, f"nohup sleep 300 >/dev/null 2>&1 & echo $! > {pid_file}")
    root = Path(sandbox.layout.root)
    if backend == "docker":
        assert len(labelled_containers(run_id)) == 1
    else:
        host_pid = int((await sandbox.client.get_file(pid_file)).decode())
    await sandbox.stop()
    await sandbox.stop()  # twice is fine
    if backend == "docker":
        assert labelled_containers(run_id) == []
    else:
        assert not root.exists()
        assert (
            not Path(f"/proc/{host_pid}").exists()
            or "Z" in Path(f"/proc/{host_pid}/stat").read_text().split()[2]
        )


async def test_a_long_run_name_still_starts(backend: str, task: Task) -> None:
    """Job rollouts have long names (task, agent, model spec, repeat); the sidecar's socket
    path must stay within the 107 bytes a Unix socket allows."""
    sandbox = create_sandbox(backend, task, "x" * 200)
    try:
        await sandbox.start()
        assert (await sandbox.client.health()).ready
    finally:
        await sandbox.stop()


async def test_restore_is_exact_on_a_file_system_that_clones(
    task: Task, run_id: str, reflink_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend with its folder on btrfs or XFS: large files are cloned, not archived."""
    monkeypatch.setattr(tempfile, "tempdir", str(reflink_dir))
    sandbox = create_sandbox("local", task, run_id)
    assert Path(sandbox.layout.root).is_relative_to(reflink_dir)
    await sandbox.start()
    try:
        await check_hard_cases(sandbox)
        archive = Path(sandbox.layout.root, ".reroll", "state", "snapshots", "hard", "content.tar")
        assert archive.stat().st_size < 300_000, "the large file went into the archive, not cloned"
    finally:
        await sandbox.stop()
