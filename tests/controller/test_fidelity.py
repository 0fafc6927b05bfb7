"""The fidelity report's per-step verdicts, from a rebuilt run's trajectory (no replay run)."""

from __future__ import annotations

import json
from pathlib import Path

from reroll.fidelity import _step_reports
from reroll.runfolder import TRAJECTORY


def test_an_attempt_superseded_by_its_retry_is_retried_not_missing(tmp_path: Path) -> None:
    lines = [
        {
            "request": {"timestamp": "t", "path": "/v1/chat/completions", "body": {}},
            "response": {"timestamp": "t", "status_code": 200, "body": {}},
            "metadata": {"step": step, "source": "replayed", "replayed_from": served},
        }
        for step, served in enumerate([1, 2])
    ]
    path = tmp_path / TRAJECTORY
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reports = _step_reports(tmp_path, 4, retried={0})
    assert [r.verdict for r in reports] == ["retried", "match", "match", "missing"]
