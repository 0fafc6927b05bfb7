"""The host's CA bundle in the agent and verifier phases: trusted (copied in and named by
``SSL_CERT_FILE``, ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``) when the task's network allows egress,
so a test script's ``pip install`` works behind a TLS-intercepting proxy; absent under ``none``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.cache import host_ca_bundle
from reroll.sandbox.base import HOST_CA_PATH

pytestmark = pytest.mark.slow

REROLL = str(Path(sys.executable).parent / "reroll")
REPORT = 'for name in SSL_CERT_FILE PIP_CERT REQUESTS_CA_BUNDLE; do eval "p=\\${$name:-}"; '
REPORT += 'if [ -n "$p" ]; then echo "$1 $name $p $(sha256sum < "$p" | cut -c1-64)"; '
REPORT += 'else echo "$1 $name none"; fi; done'
"""Prints ``PHASE NAME PATH SHA256`` (or ``PHASE NAME none``) for each CA variable; $1 is the phase."""


def _task(root: Path) -> Path:
    """A task whose oracle and test script each report the CA variables they see (the oracle's
    report is kept in the workspace; the test script prints both)."""
    (root / "solution").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "task.md").write_text(f"---\nname: {root.name}\n---\nNothing to do.\n")
    report = root / "solution" / "solve.sh"
    report.write_text(f"#!/bin/sh\nset -- agent\n({REPORT}) > ca-agent.txt\n")
    (root / "tests" / "test.sh").write_text(
        f'#!/bin/sh\ncat "$REROLL_WORKSPACE/ca-agent.txt"\nset -- verifier\n{REPORT}\n'
        'mkdir -p "$REROLL_LOGS_DIR/verifier" && echo 1 > "$REROLL_LOGS_DIR/verifier/reward.txt"\n'
    )
    return root


@pytest.mark.parametrize("network", ["full", "none"])
def test_the_agent_and_the_verifier_trust_the_hosts_ca_only_with_egress(
    tmp_path: Path, sandbox_backend: str, network: str
) -> None:
    bundle = host_ca_bundle()
    if bundle is None:
        pytest.skip("this host has no CA bundle")
    task = _task(tmp_path / "host-ca")
    done = subprocess.run(
        [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", sandbox_backend,
         "--network", network, "--jobs-dir", "jobs"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = (tmp_path / "jobs").glob("*/*")
    assert json.loads((run / "result.json").read_text())["rewards"] == {"reward": 1.0}
    lines = (run / "verifier" / "test-stdout.txt").read_text().split("\n")
    reports = {tuple(line.split()[:2]): line.split()[2:] for line in lines if line.strip()}
    assert len(reports) == 6, lines
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    for (phase, name), seen in reports.items():
        if network == "none":
            assert seen == ["none"], (phase, name, seen)
        else:  # the path in the sandbox's own view (the isolated local sandbox's root is / too)
            assert seen == [HOST_CA_PATH, digest], (phase, name, seen)
