"""Red team, issue 30: a task's deny list (BenchFlow's ``network_mode: denylist`` with
``blocked_hosts``) keeps the agent phase from the denied host, and from nothing else; the verify
phase (``full``: BenchFlow's deny list holds the agent only) reaches both.

No internet and no DNS here, so "outside" is the allow-list test's network namespace (two
addresses, one TCP server), and the denied name resolves on the host only for this run: reroll
runs in a mount namespace of its own whose ``/etc/hosts`` names `DENIED` at the first address.
The oracle and the test script each try both addresses (directly, and through ``$HTTPS_PROXY``'s
``CONNECT`` where set, as the local sandbox names its proxy) and report what answered.
"""

from __future__ import annotations

import json
import os
import shutil
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


def run_naming(task: Path, jobs: Path, backend: str, hosts_line: str) -> dict[str, Any]:
    """`reroll run TASK --agent oracle` in a mount namespace whose ``/etc/hosts`` has
    `hosts_line` too: its result.json, with its config.json under ``config``."""
    if backend == "docker":
        # The private mount namespace hides the docker backend's disk-quota mounts (under /tmp)
        # from the daemon, which then cannot bind them (seen: "failed to mount local volume").
        # docker's deny sets are checked by nft (tests/sandbox/docker/test_firewall.py).
        pytest.skip("naming the denied host for one run needs a mount namespace the docker daemon cannot see")
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is needed to name the denied host for one run")
    hosts = jobs.parent / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + hosts_line + "\n")
    command = [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", str(jobs)]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts), *command],
        capture_output=True, text=True, timeout=900, env=os.environ,
    )  # fmt: skip
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
        files = {"task.md": text, "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n"}
        files |= {"oracle/solve.sh": SOLVE, "verifier/test.sh": TEST_SH}
        task = write_task(
            tmp_path / "denylist", files | {f"{d}/probe.py": PROBE for d in ("oracle", "verifier")}
        )
        checked = subprocess.run(
            [REROLL, "task", "check", str(task)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "COLUMNS": "400"},
        )  # fmt: skip
        result = run_naming(task, tmp_path / "jobs", sandbox_backend, f"{first} {DENIED}")
    assert f"agent (and oracle) full - denied: {DENIED}" in checked.stdout, checked.stdout
    assert "blocked_hosts" not in checked.stdout.split("ignored", 1)[-1], checked.stdout  # not "ignored"
    assert result["status"] == "ok", result.get("error")
    rewards = result["rewards"]
    # agent_listed: the first address (the denied host's); agent_other: the second (not denied)
    assert (rewards["agent_listed"], rewards["agent_other"]) == (0.0, 1.0), rewards
    assert (rewards["verifier_listed"], rewards["verifier_other"]) == (1.0, 1.0), rewards
    assert f"{first} agent" not in seen and f"{second} agent" in seen, seen
    assert result["config"]["network_phases"]["agent_denied"] == [DENIED]
