"""The ``ors-episode`` verifier: the terminal reward of declared ORS reward records
(`reroll.rollout.verify.ors_episode`), read as BenchFlow reads them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from reroll.rollout.verify.ors_episode import OrsEpisodeVerifier, load_records, read_episode
from reroll.rollout.verify.verifiers import VerifyRequest
from reroll.sandbox.layout import SandboxLayout
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError, VerifierError

from tests.e2e.test_reward_hacks import run_oracle

ORS_TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-ors-episode"
"""A task in BenchFlow's format scored by an ors-episode strategy named ``ors`` over
``/logs/agent/episode.jsonl`` (its oracle logs a dense step reward, then a terminal 1.0)."""
DENSE = {"type": "dense", "reward": 0.5, "step": 1, "granularity": "step", "space": "action"}


def test_terminal_events_give_the_reward_and_the_strategy_names_the_item() -> None:
    result = read_episode([DENSE, {"type": "terminal", "reward": 0.75, "step": 2}], "ors")
    assert (result.reward, result.items) == (0.75, {"ors": 0.75})
    assert [(event.reward, event.space, event.granularity) for event in result.events] == [
        (0.5, "action", "step"),
        (0.75, "output", "terminal"),
    ]
    assert [event.note for event in result.events] == ["ORS step 1", "ORS step 2"]
    assert all(event.step is None for event in result.events)  # not an exchange of the trajectory


def test_a_reward_response_is_the_headline_with_its_items() -> None:
    response = {
        "reward": 0.25,
        "is_valid": True,
        "metadata": {"items": {"a": 0.5, "b": 0.0}, "space": "action"},
    }
    result = read_episode([DENSE, response], "ors")
    assert (result.reward, result.items, result.space) == (0.25, {"a": 0.5, "b": 0.0}, "action")
    episode = {"events": [DENSE], "reward": 0.5, "items": {"c": 1.0}}
    assert read_episode([episode], "ors").items == {"c": 1.0}


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([DENSE], "did not include a terminal reward"),
        (
            [{"reward": 1.0}, {"reward": 0.0, "granularity": "terminal"}],
            r"conflicting terminal rewards \[0.0, 1.0\]",
        ),
        ([{"reward": 1.0, "is_valid": False, "metadata": {"error": "boom"}}], r"records\[0\]: boom"),
        ([{"reward": 1.0, "metadata": {"items": {}, "error": "late"}}], "invalid ORS reward evidence: late"),
        ([{"reward": 1.5}], r"records\[0\]\.reward must be a finite numeric reward between 0\.0 and 1\.0"),
        ([{"reward": "x"}], r"records\[0\]\.reward must be a numeric reward"),
        ([{"reward": 1.0, "step": "2"}], r"records\[0\]\.step must be an integer"),
        ([{"reward": 1.0, "space": "vibes"}], r"records\[0\]\.space must be one of"),
        ([{"events": {"reward": 1.0}}], r"records\[0\]\.events must be a list"),
    ],
)
def test_bad_evidence_is_a_verifier_error_naming_the_field(
    records: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(VerifierError, match=message):
        read_episode(records, "ors")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("e.jsonl", '{"reward": 1}\n[1]\n', "record 2 must be a JSON object"),
        ("e.jsonl", "\n\n", "has no JSON records"),
        ("e.json", "{broken", "is not valid JSON"),
        ("e.json", "[]", "has no JSON records"),
        ("e.json", "3", "must be a JSON object or list of objects"),
    ],
)
def test_a_bad_input_file_is_refused_naming_it(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(VerifierError, match=f"ors-episode input 'declared/{name}' {message}"):
        load_records(tmp_path / name, f"declared/{name}")
    with pytest.raises(VerifierError, match="must resolve to a regular file"):
        load_records(tmp_path / "missing.json", "missing.json")


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ("[]", "inputs must be a non-empty list"),
        ("[../x.json]", "must stay inside"),
        ("[a.json], format: xml", "format"),
    ],
)
def test_a_bad_strategy_is_refused_at_load(tmp_path: Path, inputs: str, message: str) -> None:
    task = tmp_path / "task"
    shutil.copytree(ORS_TASK, task)
    doc = task / "verifier" / "verifier.md"
    doc.write_text(doc.read_text().replace("[/logs/agent/episode.jsonl]\n      format: jsonl", inputs))
    with pytest.raises(TaskError, match=message):
        load_task(task)


class _NoSandbox:
    """A sandbox a verify that reads only the run folder never touches (but its layout)."""

    layout = SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/root", agents_dir="/agents")


async def test_a_relative_input_is_read_from_the_run_folder(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(ORS_TASK, task)
    doc = task / "verifier" / "verifier.md"
    doc.write_text(doc.read_text().replace("/logs/agent/episode.jsonl", "trajectory/ors-rewards.jsonl"))
    verifier = OrsEpisodeVerifier(load_task(task), load_task(task).spec.verifier.options)
    run = tmp_path / "run"
    (run / "trajectory").mkdir(parents=True)
    request = VerifyRequest(sandbox=_NoSandbox(), env={}, run_dir=run, output_dir=run / "verifier", soft=True)  # type: ignore[arg-type]
    missing = await verifier.verify(request)
    assert missing.status == "error" and "was not found in the run folder" in missing.error
    (run / "trajectory" / "ors-rewards.jsonl").write_text(
        json.dumps({"reward": 0.5, "finished": True}) + "\n"
    )
    verdict = await verifier.verify(request)
    assert (verdict.status, verdict.rewards) == ("ok", {"reward": 0.5, "ors": 0.5})
    details = json.loads((run / "verifier" / "reward-details.json").read_text())
    assert details["inputs"][0]["records"] == 1
    assert json.loads((run / "verifier" / "reward.json").read_text())["reward"] == 0.5


@pytest.mark.spawns
@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.slow)])
def test_an_ors_episode_scores_the_run(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """The oracle's log (a dense 0.5, then a terminal 1.0) scores 1.0, read from the sandbox's
    /logs/agent/episode.jsonl once the agent is done."""
    if backend == "docker":
        request.getfixturevalue("docker_images")
    result, folder = run_oracle(ORS_TASK, tmp_path, backend=backend, timeout_seconds=600)
    assert result["status"] == "ok", result
    assert result["rewards"] == {"reward": 1.0, "ors": 1.0}
    assert [event["reward"] for event in result["verify_result"]["events"]] == [0.5, 1.0]
    details = json.loads((folder / "verifier" / "reward-details.json").read_text())
    assert details["inputs"][0]["local_path"].endswith("ors-episode-inputs/0-logs__agent__episode.jsonl")
