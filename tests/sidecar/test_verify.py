"""The Verifier in this process: hardening's time limit ends in a reward error, never a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_sidecar import processes, quiesce, verify, verify_ns
from reroll_sidecar.rewards import read_rewards
from reroll_sidecar.snapshots import SnapshotStore


async def test_hardening_that_outlives_its_time_limit_skips_the_script_with_a_reward_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck_quiesce(*_: object, **__: object) -> int:
        time.sleep(1.0)  # e.g. a /proc scan that never ends: far beyond the limit below
        return 0

    monkeypatch.setattr(quiesce, "quiesce", stuck_quiesce)
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore(str(tmp_path / "state")), 0.05)
    verifier.baseline = verify.Baseline(pb.Hardening(), agent_user="", roots=[str(tmp_path)], site_dirs=[])
    (tmp_path / "test.sh").write_text("#!/bin/sh\ntouch ran\necho 1 > reward.txt\n")
    request = pb.VerifyRequest(verifier_dir=str(tmp_path), script="test.sh", reward_dir=str(tmp_path))
    started = time.monotonic()
    events = [event async for event in verifier.verify(request)]
    assert time.monotonic() - started < 0.9, "the limit did not cut the stuck step short"
    report, result = events[0].hardening, events[-1].result
    expected = "hardening failed, the test script was not run: hardening took longer than 0.05 s"
    assert (list(report.notes), result.reward_error, len(events)) == ([expected], expected, 2)
    assert not (tmp_path / "ran").exists() and not result.rewards


def test_the_default_hardening_time_limit_is_two_minutes() -> None:
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore("/nonexistent"))
    assert verifier.harden_timeout_seconds == verify.HARDEN_TIMEOUT_SECONDS == 120.0


async def test_an_old_reward_file_that_cannot_be_deleted_is_a_reward_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team: a reward file the agent made undeletable (``chattr +i``, here a folder) was an
    unhandled error, so an infrastructure error a job retries."""
    monkeypatch.setattr(quiesce, "quiesce", lambda *_, **__: 0)  # no process of ours to stop
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore(str(tmp_path / "state")))
    hardening = pb.Hardening(plugin_autoload=True)  # no python3 to scan for plugins in this tier
    verifier.baseline = verify.Baseline(hardening, agent_user="", roots=[str(tmp_path)], site_dirs=[])
    (tmp_path / "test.sh").write_text("#!/bin/sh\ntouch ran\n")
    (tmp_path / "reward.txt").mkdir()
    (tmp_path / "reward.txt" / "x").write_text("1")
    request = pb.VerifyRequest(verifier_dir=str(tmp_path), script="test.sh", reward_dir=str(tmp_path))
    events = [event async for event in verifier.verify(request)]
    result = events[-1].result
    assert (
        result.reward_error.startswith(f"cannot delete the old {tmp_path}/reward.txt: ")
        and not result.rewards
    )
    assert not (tmp_path / "ran").exists()


@pytest.mark.spawns  # the test script runs
@pytest.mark.parametrize("soft", [False, True])
async def test_a_soft_verify_leaves_planted_hooks_a_full_one_deletes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, soft: bool
) -> None:
    """Between a trial's rounds (``soft``) the agent goes on working: what it planted stays; the
    test script runs either way."""
    monkeypatch.setattr(quiesce, "quiesce", lambda *_, **__: 0)  # no process of ours to stop
    workspace, verifier_dir = tmp_path / "app", tmp_path / "verifier"
    workspace.mkdir()
    verifier_dir.mkdir()
    (workspace / "conftest.py").write_text("planted = True\n")
    (verifier_dir / "test.sh").write_text("#!/bin/sh\necho 1 > reward.txt\n")
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore(str(tmp_path / "state")))
    options = pb.Hardening(delete_injected_hooks=True)
    verifier.baseline = verify.Baseline(options, agent_user="", roots=[str(workspace)], site_dirs=[])
    request = pb.VerifyRequest(
        verifier_dir=str(verifier_dir), script="test.sh", reward_dir=str(verifier_dir), soft=soft
    )
    events = [event async for event in verifier.verify(request)]
    assert dict(events[-1].result.rewards) == {"reward": 1.0}
    assert (workspace / "conftest.py").exists() is soft
    notes = list(events[0].hardening.notes)
    assert any("soft verify" in note for note in notes) is soft


def test_reward_json_wins_over_reward_txt_and_must_agree_with_it(tmp_path: Path) -> None:
    (tmp_path / "reward.txt").write_text("1\n")
    (tmp_path / "reward.json").write_text('{"reward": 1.0, "style": 0.5}')
    result = read_rewards(str(tmp_path))
    assert (result.reward_file, dict(result.rewards), result.reward_error) == (
        "reward.json",
        {"reward": 1.0, "style": 0.5},
        "",
    )
    (tmp_path / "reward.txt").write_text("0\n")
    assert "reward.txt says 0 but reward.json's reward is 1" in read_rewards(str(tmp_path)).reward_error
    (tmp_path / "reward.json").unlink()
    assert dict(read_rewards(str(tmp_path)).rewards) == {"reward": 0.0}


def test_pytest_reads_only_the_configuration_shipped_with_the_tests(tmp_path: Path) -> None:
    assert verify.shipped_pytest_config(str(tmp_path)) is None
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # not pytest's
    assert verify.shipped_pytest_config(str(tmp_path)) is None
    (tmp_path / "tox.ini").write_text("[pytest]\naddopts = -q\n")
    assert verify.shipped_pytest_config(str(tmp_path)) == str(tmp_path / "tox.ini")
    (tmp_path / "pytest.ini").write_text("")
    assert verify.shipped_pytest_config(str(tmp_path)) == str(tmp_path / "pytest.ini")


def test_a_soft_verify_keeps_tmp_when_its_folders_lie_there() -> None:
    assert verify_ns.under_fresh_tmp(["/verifier", "/tmp/reroll-x/verifier"])
    assert verify_ns.under_fresh_tmp(["/var/tmp"])
    assert not verify_ns.under_fresh_tmp(["/verifier", "/logs/verifier", "/app", "/tmpfoo", "relative/tmp"])


async def test_a_stricter_verifier_is_not_run_where_its_network_namespace_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``own_network`` (the verifier's policy none under an agent's full) is never downgraded to
    the sandbox's network: without the namespace the script does not run."""

    def unavailable(own_net: bool = False) -> str:
        return "unshare: Operation not permitted" if own_net else ""

    monkeypatch.setattr(verify_ns, "refusal", unavailable)
    verifier = verify.Verifier(processes.ProcessGroups(), SnapshotStore(str(tmp_path / "state")))
    verifier.baseline = verify.Baseline(pb.Hardening(), agent_user="", roots=[str(tmp_path)], site_dirs=[])
    (tmp_path / "test.sh").write_text("#!/bin/sh\ntouch ran\necho 1 > reward.txt\n")
    request = pb.VerifyRequest(
        verifier_dir=str(tmp_path), script="test.sh", reward_dir=str(tmp_path), own_network=True
    )
    events = [event async for event in verifier.verify(request)]
    result = events[-1].result
    assert "network policy none" in result.reward_error and "Operation not permitted" in result.reward_error
    assert not (tmp_path / "ran").exists() and not result.rewards
