"""Many rollouts at once on the isolated `local` sandbox, through ``reroll job`` (the controller
on uvloop, as users run it): every sandbox starts at its first attempt. Before gRPC's fork
handlers were kept off in the controller (`reroll.host.forking`), children forked while
other rollouts' gRPC calls ran died of SIGSEGV before their exec (pasta "exit -11", "bwrap
reported no child pid"), and the job retried them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.sandbox.local import rootview

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]

REROLL = str(Path(sys.executable).parent / "reroll")
ROLLOUTS = 64
ASK = (
    "import json, os, urllib.request as r; "
    "r.urlopen(r.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', "
    "data=json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(), "
    "headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], "
    "'Content-Type': 'application/json'}), timeout=300).read()"
)


def test_64_tiny_rollouts_at_once_all_start_first_time(tmp_path: Path, examples: Path) -> None:
    """Each agent holds 20 s (so that dozens are alive, their sidecars' gRPC streams open, while
    the others start: at most 4 start at once), asks the scripted model twice, writes the file."""
    agents = {
        "tiny": {
            "description": "holds, two LLM calls, the answer file",
            "api_format": "openai-chat",
            "launch": f'sleep 20; python3 -c "{ASK}" && python3 -c "{ASK}" && '
            "echo 'Hello, reroll!' > hello.txt",
            "env": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"},
        }
    }
    (tmp_path / "agents.yaml").write_text(json.dumps(agents))
    (tmp_path / "script.yaml").write_text("turns:\n  - content: ok\n")
    done = subprocess.run(
        [REROLL, "job", "--task", str(examples / "hello-file"), "--agent", "tiny", "--model",
         f"scripted:{tmp_path / 'script.yaml'}", "--repeats", str(ROLLOUTS), "--concurrency",
         str(ROLLOUTS), "--job-name", "many", "--timeout", "600"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "REROLL_AGENTS_FILE": str(tmp_path / "agents.yaml")},
        timeout=1800,
    )  # fmt: skip
    job = tmp_path / "jobs" / "many"
    summary = json.loads((job / "summary.json").read_text())
    failed = [(r["status"], r["error"]) for r in summary["rollouts"] if r["status"] != "ok"]
    assert failed == [], failed
    assert done.returncode == 0, done.stderr[-2000:]
    retried = [(r["attempts"], r["error"]) for r in summary["rollouts"] if r["attempts"] != 1]
    assert retried == [], f"rollouts retried: {retried}"
    assert "skipping fork() handlers" not in done.stderr + done.stdout
