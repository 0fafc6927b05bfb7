"""Red team, issue 30: a task's deny list (BenchFlow's ``network_mode: denylist`` with
``blocked_hosts``) keeps the agent phase from the denied host, and from nothing else; the verify
phase (``full``: BenchFlow's deny list holds the agent only) reaches both.

No internet and no DNS here, so "outside" is the allow-list test's network namespace (two
addresses, one TCP server), and the denied name resolves on the host only for this run: reroll's
processes (the controller, which resolves deny lists for docker's firewall and the local proxy;
mitmproxy) start with a ``sitecustomize`` on ``PYTHONPATH`` whose ``getaddrinfo`` names `DENIED`
at the first address (`naming`). (A private mount namespace with its own ``/etc/hosts`` hid the
docker backend's disk mounts from the Docker daemon.)
The oracle and the test script each try both addresses (directly, and through ``$HTTPS_PROXY``'s
``CONNECT`` where set, as the local sandbox names its proxy) and report what answered.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.security.test_phase_allowlist import PROBE, REROLL, SOLVE, TEST_SH, outside
from tests.security.test_phase_allowlist import TASK_MD as ALLOWLIST_TASK_MD
from tests.security.test_phase_network import write_task

pytestmark = pytest.mark.slow
DENIED = "denied.reroll.test"
TASK_MD = (
    ALLOWLIST_TASK_MD.replace("  network_mode: allowlist\n  allowed_hosts: [AGENT_HOST]\n", "")
    .replace("  network_mode: allowlist\n  allowed_hosts: [VERIFIER_HOST]\n", "")
    .replace(
        "  memory_mb: 1024\n", "  memory_mb: 1024\n  network_mode: denylist\n  blocked_hosts: [DENIED]\n"
    )
)
"""The allow-list test's task, its phases' lists dropped, a deny list on the sandbox."""


SITECUSTOMIZE = """import socket

NAMES = NAMES_MAP
_real = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if isinstance(name, str) and name.lower().rstrip(".") in NAMES:
        host = NAMES[name.lower().rstrip(".")]
    return _real(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
"""
"""What names the test's hosts in every Python process of reroll's (``NAMES_MAP``: name → address)."""


def naming(folder: Path, names: dict[str, str]) -> dict[str, str]:
    """The environment under which reroll's Python processes resolve each of `names` (name →
    address) on the host: a ``sitecustomize`` written to `folder`, put first on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("NAMES_MAP", repr(names)))
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def checked_task(root: Path, task_md: str, scripts: dict[str, str]) -> tuple[Path, str]:
    """A task at `root` (`task_md`, the base image, `scripts`: ``oracle/solve.sh``,
    ``verifier/test.sh`` and ``probe.py``, the last in both folders) and what ``reroll task check``
    printed of it on a wide console."""
    files = {"task.md": task_md, "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n"}
    files |= {"oracle/solve.sh": scripts["solve"], "verifier/test.sh": scripts["test"]}
    task = write_task(root, files | {f"{d}/probe.py": scripts["probe"] for d in ("oracle", "verifier")})
    checked = subprocess.run(
        [REROLL, "task", "check", str(task)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    return task, checked.stdout


def run_naming(task: Path, jobs: Path, backend: str, names: dict[str, str]) -> dict[str, Any]:
    """`reroll run TASK --agent oracle` with `names` resolved on the host (`naming`): its
    result.json, with its config.json under ``config``."""
    command = [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", str(jobs)]
    env = naming(jobs.parent / "names", names)
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = jobs.glob("*/*/result.json")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["config"] = json.loads((result_file.parent / "config.json").read_text())
    return result


def test_the_agent_does_not_reach_a_denied_host(sandbox_backend: str, tmp_path: Path) -> None:
    with outside() as (first, second, port, seen):
        assert "network_mode: denylist" in TASK_MD and "allowlist" not in TASK_MD
        text = TASK_MD.replace("NAME", "denylist").replace("DENIED", DENIED)
        text = text.replace("TARGETS_LIST", f"'{first}:{port} {second}:{port}'")
        scripts = {"solve": SOLVE, "test": TEST_SH, "probe": PROBE}
        task, checked = checked_task(tmp_path / "denylist", text, scripts)
        result = run_naming(task, tmp_path / "jobs", sandbox_backend, {DENIED: first})
    assert f"agent (and oracle) full - denied: {DENIED}" in checked, checked
    assert "blocked_hosts" not in checked.split("ignored", 1)[-1], checked  # not "ignored"
    assert result["status"] == "ok", result.get("error")
    rewards = result["rewards"]
    # agent_listed: the first address (the denied host's); agent_other: the second (not denied)
    assert (rewards["agent_listed"], rewards["agent_other"]) == (0.0, 1.0), rewards
    assert (rewards["verifier_listed"], rewards["verifier_other"]) == (1.0, 1.0), rewards
    assert f"{first} agent" not in seen and f"{second} agent" in seen, seen
    assert result["config"]["network_phases"]["agent_denied"] == [DENIED]
