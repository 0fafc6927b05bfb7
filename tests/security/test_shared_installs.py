"""Red team, issue 19 item 4: shared installs are read-only to every rollout and checked before use.

Before: the docker volume ``reroll-agents`` (agent installs, the Python runtime) was mounted
read-write in every container, so container root in one rollout (a legacy task's root agent, or
a verifier importing what the agent planted) wrote into it, and every later rollout ran that.

The agent ``installs-attack`` (declared through ``REROLL_AGENTS_FILE``; its install writes
``tool.sh``) runs as root on a task under network ``none``. Told ATTACK, it writes a payload into
the workspace and runs it: append to its own ``tool.sh``, plant files beside it and in the
agents folder, remount that folder read-write and try again; the task's verifier (root) runs the
payload too. A later, separate rollout of the same agent is told INSPECT: it runs ``tool.sh`` and
lists its install. Tampering from outside (the host, or an older reroll) is done on the host
folder of the install, then the next rollout must refuse it and install again.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.agents import AgentSpec
from reroll.installs.python_runtime import host_python
from reroll.installs.store import InstallStore, provide_runtime
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.tasks.task import load_task

from tests.conftest import EXAMPLES
from tests.e2e.test_reward_hacks import write_files

pytestmark = [pytest.mark.slow, pytest.mark.spawns]
REROLL = str(Path(sys.executable).parent / "reroll")
INSTALL = """printf '#!/bin/sh\\necho honest tool\\n' > "$REROLL_AGENT_HOME/tool.sh"
chmod 755 "$REROLL_AGENT_HOME/tool.sh"
"""
PAYLOAD = r"""
who=$1
agents=$(dirname "$home")
try() {  # try WHAT COMMAND...: say whether root could do it
  what=$1; shift
  if "$@" 2>/dev/null; then echo "ATTACK $who $what: done"; else echo "ATTACK $who $what: refused"; fi
}
attack() {
  try "append to tool.sh" sh -c "echo 'echo POISONED' >> '$home/tool.sh'"
  try "plant in the install" touch "$home/planted-$who"
  try "plant in the agents folder" touch "$agents/planted-$who"
}
attack
try remount mount -o remount,rw "$agents"
attack
"""
LAUNCH = """if grep -q ATTACK "$REROLL_PROMPT_FILE"; then
  printf 'home=%s\\n' "$REROLL_AGENT_HOME" > payload.sh
  cat >> payload.sh <<'EOF'
PAYLOAD
EOF
  sh payload.sh agent
else
  "$REROLL_AGENT_HOME/tool.sh"; echo INSTALL: $(ls -A "$REROLL_AGENT_HOME")
  echo AGENTS FOLDER: $(ls -A "$REROLL_AGENT_HOME/..")
fi
""".replace("PAYLOAD", PAYLOAD)
AGENT: dict[str, Any] = {
    "description": "installs tool.sh; told ATTACK, tries to change its install as root",
    "api_format": "none",
    "install": INSTALL,
    "launch": LAUNCH,
}
TEST_SH = """#!/bin/sh
# Runs what the agent left, as a verifier importing the agent's code would (as root).
workspace="${REROLL_WORKSPACE:-/app}"
[ -f "$workspace/payload.sh" ] && sh "$workspace/payload.sh" verifier
mkdir -p "${REROLL_LOGS_DIR:-/logs}/verifier"
echo 1 > "${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
"""


@pytest.fixture(scope="module")
def agents_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("installs-attack") / "agents.yaml"
    path.write_text(yaml.safe_dump({"installs-attack": AGENT}))
    return path


def make_task(root: Path, order: str) -> Path:
    front = {
        "name": f"installs-{order.lower()}",
        "agent": {"user": "root", "timeout_sec": 60},
        "verifier": {"timeout_sec": 60},
        "environment": {"network": "none"},
    }
    files = {
        "task.md": f"---\n{json.dumps(front)}\n---\n{order}\n",
        "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n",
        "verifier/test.sh": TEST_SH,
    }
    return write_files(root / order.lower(), files)


def run(
    task: Path, workdir: Path, backend: str, agents_file: Path, env: dict[str, str]
) -> tuple[dict[str, Any], Path, str]:
    """``reroll run`` `task` with ``installs-attack`` in a fresh jobs folder under `workdir`;
    returns result.json, the run folder and reroll's own output."""
    jobs = workdir / f"jobs-{len(list(workdir.glob('jobs-*')))}"
    done = subprocess.run(
        [
            REROLL,
            "run",
            str(task),
            "--agent",
            "installs-attack",
            "--sandbox",
            backend,
            "--jobs-dir",
            str(jobs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env, "REROLL_AGENTS_FILE": str(agents_file)},
    )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = jobs.glob("*/*/result.json")
    return json.loads(result_file.read_text()), result_file.parent, done.stdout + done.stderr


def unit() -> str:
    return AgentSpec(name="installs-attack", **AGENT).install_key


@pytest.fixture(scope="module", params=["docker", "local"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, InstallStore, dict[str, str]]:
    """The backend, its install store (on the host) and the environment of reroll: docker's
    volumes; for local a cache folder of this module's own."""
    if request.param == "docker":
        request.getfixturevalue("docker_images")
        from reroll.sandbox.docker.engine import docker_client
        from reroll.sandbox.docker.installs import install_store

        with contextlib.closing(docker_client()) as engine:
            return "docker", InstallStore.of(install_store(engine)), {}
    cache = tmp_path_factory.mktemp("installs-cache")
    store = InstallStore(folder=cache / "agents", manifests=cache / "install-manifests")
    return "local", store, {"REROLL_CACHE_DIR": str(cache)}


def outcomes(text: str) -> dict[str, str]:
    """``{"agent append to tool.sh": "refused", ...}`` from the payload's ATTACK lines (last wins)."""
    found = {}
    for line in text.splitlines():
        if line.startswith("ATTACK "):
            what, _, outcome = line.removeprefix("ATTACK ").rpartition(": ")
            found[what] = outcome
    return found


def test_root_in_a_rollout_cannot_change_what_later_rollouts_run(
    backend: tuple[str, InstallStore, dict[str, str]], agents_file: Path, tmp_path: Path
) -> None:
    name, store, env = backend
    result, folder, _ = run(make_task(tmp_path, "ATTACK"), tmp_path, name, agents_file, env)
    assert result["status"] == "ok", result
    said = outcomes((folder / "agent" / "output.log").read_text())
    said |= outcomes((folder / "verifier" / "test-stdout.txt").read_text())
    writes = [f"{who} {what}" for who in ("agent", "verifier") for what in (
        "append to tool.sh", "plant in the install", "plant in the agents folder")]  # fmt: skip
    assert set(writes) <= set(said), f"the payload did not run everywhere: {said}"
    if name == "docker":  # a container's root has no CAP_SYS_ADMIN: the mount stays read-only
        assert {said[w] for w in writes} == {"refused"}, said
        assert said["agent remount"] == said["verifier remount"] == "refused", said
        assert store.check(unit(), full=True) == "", "the install changed"
        assert not list(store.folder.glob("planted-*")), "a file was planted beside the installs"
    # Whatever the attack did, the next rollout runs the install as it was made.
    result, folder, log = run(make_task(tmp_path, "INSPECT"), tmp_path, name, agents_file, env)
    output = (folder / "agent" / "output.log").read_text()
    assert result["status"] == "ok", result
    assert "honest tool" in output and "POISON" not in output, output
    assert listed(output, "INSTALL") == [".installed", "tool.sh"], output
    if name == "docker":
        assert not [n for n in listed(output, "AGENTS FOLDER") if n.startswith("planted")], output
    elif "done" in said.values():  # root of today's local sandbox could remount the folder
        assert "refusing the install" in log, "the write went unnoticed"


def listed(output: str, label: str) -> list[str]:
    """The names the INSPECT agent listed after `label`."""
    (line,) = [line for line in output.splitlines() if line.startswith(f"{label}: ")]
    return line.removeprefix(f"{label}: ").split()


TAMPERS = {
    "poisoned, same size and mtime": "same-size",
    "a file planted": "plant",
    "made by an older reroll (no manifest)": "no-manifest",
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_a_tampered_install_is_refused_and_installed_again(
    tamper: str, backend: tuple[str, InstallStore, dict[str, str]], agents_file: Path, tmp_path: Path
) -> None:
    name, store, env = backend
    inspect = make_task(tmp_path, "INSPECT")
    result, _, _ = run(inspect, tmp_path, name, agents_file, env)
    assert result["status"] == "ok" and store.check(unit()) == "", result
    tool = store.folder / unit() / "tool.sh"
    kind = TAMPERS[tamper]
    if kind == "same-size":  # what the host (or an old reroll's container root) could do
        before = tool.stat()
        tool.write_text("#!/bin/sh\necho POISON tool\n")
        os.utime(tool, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert tool.stat().st_size == before.st_size
    elif kind == "plant":
        (store.folder / unit() / "sitecustomize.py").write_text("print('POISONED')\n")
    else:
        store.manifest_file(unit()).unlink()
    result, folder, log = run(inspect, tmp_path, name, agents_file, env)
    output = (folder / "agent" / "output.log").read_text()
    assert result["status"] == "ok", result
    assert f"refusing the install {store.folder / unit()}" in log, log
    assert "honest tool" in output and "POISON" not in output, output
    assert listed(output, "INSTALL") == [".installed", "tool.sh"], output
    assert store.check(unit(), full=True) == "", "installed again and recorded"


@pytest.mark.skipif(host_python("3.12") is None, reason="no Python 3.12 on this host to lend")
async def test_the_python_runtime_is_an_install_of_its_own_checked_and_uploaded_again(
    docker_images: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker: the relocatable runtime is uploaded by an install container, runs read-only in
    the rollout's, and once changed on the host it is refused and uploaded again. A runtime of
    its own (another recipe text, so another unit): the shared one is in use by the agents'
    rollouts of other test modules, whose Python would vanish while it is replaced."""
    from reroll.installs import python_runtime
    from reroll.sandbox.docker.backend import DockerSandbox
    from reroll.sandbox.docker.config import DockerSandboxConfig

    monkeypatch.setattr(python_runtime, "_RECIPE", f"{python_runtime._RECIPE}; this test's own copy")

    task = load_task(EXAMPLES / "hello-file")
    sandbox = DockerSandbox(
        sandbox_spec(task),
        f"runtime-{uuid.uuid4().hex[:8]}",
        DockerSandboxConfig(image="reroll/base:bookworm"),
    )
    said: list[str] = []
    await sandbox.start()
    try:
        store = InstallStore.of(await sandbox.install_store())
        for attempt in ("first", "after tampering"):
            async with sandbox.installer() as installer:
                python, requires = await provide_runtime(
                    installer, "3.12", {"PATH": "/usr/bin:/bin"}, said.append
                )
            (unit,) = requires
            assert python == f"{sandbox.layout.agents_dir}/{unit}/bin/python3.12" and store.check(unit) == ""
            ran = await sandbox.exec([python, "-c", "import ssl, sys; print(sys.version_info[:2])"])
            assert ran.stdout.strip() == b"(3, 12)", ran.output_text()
            if attempt == "first":
                (store.folder / unit / "lib" / "python3.12" / "sitecustomize.py").write_text(
                    "print('POISON')\n"
                )
        assert any(line.startswith(f"refusing the Python runtime {store.folder / unit}") for line in said), (
            said
        )
    finally:
        await sandbox.stop()
