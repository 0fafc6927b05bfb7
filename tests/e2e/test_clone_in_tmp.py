"""A new user's first steps from a clone under ``/tmp``: ``make env`` then ``make demo`` (issue 19).

Before the isolated local sandbox ran the bundled sidecar, the demo failed there with ``No
module named reroll_sidecar``: the sidecar ran from the controller's venv, which the sandbox's
private ``/tmp`` hid. The clone is of this checkout's committed ``HEAD``; its venv comes from
``uv.lock`` (uv's cache makes that quick), the agent's install from reroll's cache.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from reroll.sandbox.local import rootview

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(not (shutil.which("git") and shutil.which("make")), reason="needs git and make"),
]
CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1500)
def test_make_demo_in_a_clone_under_tmp() -> None:
    clone = Path(tempfile.mkdtemp(prefix="reroll-clone-", dir="/tmp"))
    try:
        head = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(CHECKOUT), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", head], check=True)
        for target in ("env", "demo"):
            done = subprocess.run(
                ["make", "-C", str(clone), target, "SANDBOX=local"],
                capture_output=True,
                text=True,
                timeout=1200,
                check=False,
            )
            assert done.returncode == 0, f"make {target}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        assert "No module named" not in done.stdout + done.stderr
    finally:
        shutil.rmtree(clone, ignore_errors=True)
