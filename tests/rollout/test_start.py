"""The one rollout path (`start_rollout`): the run config it writes, its refusals, its log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.agents import get_agent
from reroll.rollout.checkpoint import open_checkpoint
from reroll.rollout.plan import RolloutPlan
from reroll.rollout.start import FromCheckpoint, NewRecording, start_rollout
from reroll.rollout.turns.persona import PersonaPlan
from reroll.runfolder.asks import AskRecord
from reroll.runfolder.run import ContinuedFrom, RunConfig, StoreUse
from reroll.settings import RolloutSettings, with_recorded_inputs
from reroll.tasks.environment import McpServerSpec
from reroll.tasks.task import load_task
from reroll.trials.config import Persona, Role, Scene, TrialConfig
from reroll_contracts.errors import AgentError, ModelError, RunFolderError, TaskError, TrialError

from tests.runfolder.test_run import exchange_line, make_run_folder


def recorded_run(tmp_path: Path, examples: Path, **config: object) -> Path:
    """A two-exchange mini-swe-agent run folder of the example task, with `config` overrides."""
    folder = make_run_folder(tmp_path / "run", [exchange_line(0), exchange_line(1)], result={"status": "ok"})
    base = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    (folder / "config.json").write_text(json.dumps(base | config))
    return folder


async def test_a_continuation_keeps_the_runs_network_override(tmp_path: Path, examples: Path) -> None:
    """config.json's ``network`` (``reroll run --network none``) outlives the task's own policy:
    continued in the local-plain sandbox (no network policy) it is refused, before anything is written."""
    task = examples / "hello-file"
    assert load_task(task).spec.environment.network == "full"
    folder = recorded_run(tmp_path, examples, task_path=str(task), network="none", sandbox="docker")
    checkpoint = open_checkpoint(folder)
    origin = FromCheckpoint(checkpoint, checkpoint.continued_from(None, replay_only=True))
    with pytest.raises(
        TaskError, match=r"--network none needs --sandbox local or docker: the local-plain sandbox"
    ):
        await start_rollout(
            origin,
            live_model=None,
            parent=tmp_path / "out",
            name="x",
            options=RolloutSettings(sandbox="local-plain"),
        )
    assert not (tmp_path / "out").exists()


async def test_a_recording_refuses_network_none_in_the_local_plain_sandbox(
    tmp_path: Path, examples: Path
) -> None:
    origin = NewRecording(load_task(examples / "hello-file"), get_agent("oracle"))
    with pytest.raises(TaskError, match="--network none needs --sandbox local or docker"):
        await start_rollout(
            origin,
            live_model=None,
            parent=tmp_path / "out",
            name="x",
            options=RolloutSettings(network="none", sandbox="local-plain"),
        )
    assert not (tmp_path / "out").exists()


MINI = {"mini-swe-agent": get_agent("mini-swe-agent")}
SINGLE = TrialConfig.single("mini-swe-agent")


def test_the_plan_reads_model_timeout_and_agent_model_from_the_one_config(
    examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RolloutPlan says nothing twice: the live model, the agent's model name and the timeout
    come from config.json's fields (a continuation keeps the original's model name)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # openai/gpt-x is parsed, and a missing key refused
    task = load_task(examples / "fix-failing-test")
    recording = RunConfig(task_path=str(task.path), agent="mini-swe-agent", model="scripted", timeout_sec=7)
    plan = RolloutPlan(task, MINI, SINGLE, Path("/nowhere"), recording)
    assert plan.timeout_seconds == 7 and plan.agent_model == "scripted"
    assert plan.live_model is not None and plan.live_model.spec == "scripted"
    provenance = ContinuedFrom(
        path="/r", status="ok", cut_index=1, original_model="scripted", live_model="openai/gpt-x"
    )
    swapped = recording.model_copy(
        update={"model": "openai/gpt-x", "timeout_sec": None, "continued_from": provenance}
    )
    plan = RolloutPlan(task, MINI, SINGLE, Path("/nowhere"), swapped)
    assert plan.agent_model == "scripted" and plan.live_model is not None
    assert plan.live_model.name == "gpt-x" and plan.timeout_seconds == task.spec.agent.timeout_sec
    replay_only = swapped.model_copy(
        update={"continued_from": provenance.model_copy(update={"replay_only": True})}
    )
    assert RolloutPlan(task, MINI, SINGLE, Path("/nowhere"), replay_only).live_model is None


def test_every_rollout_of_a_lineage_gets_the_first_recordings_git_identity_and_dates(
    tmp_path: Path, examples: Path
) -> None:
    """Stable environments: the lineage's start time is set by the recording and kept by its
    continuations (a folder without one, e.g. BenchFlow's, lends its ``started_at``)."""
    from reroll.rollout.agent_phase import stable_agent_env
    from reroll.rollout.start import _run_config

    recording = _run_config(
        NewRecording(load_task(examples / "hello-file"), get_agent("oracle")), None, RolloutSettings()
    )
    assert recording.lineage_started_at == recording.started_at is not None
    first = "2026-01-02T03:04:05+00:00"
    for config, lineage in (
        ({"started_at": first}, first),
        ({"lineage_started_at": "L", "started_at": first}, "L"),
    ):
        checkpoint = open_checkpoint(recorded_run(tmp_path / lineage[:1], examples, **config))
        continued = _run_config(
            FromCheckpoint(checkpoint, checkpoint.continued_from(None)), None, RolloutSettings()
        )
        assert continued.started_at != first and continued.lineage_started_at == lineage
        env = stable_agent_env(continued)
        assert env["GIT_AUTHOR_DATE"] == env["GIT_COMMITTER_DATE"] == lineage
        assert env["GIT_AUTHOR_EMAIL"] == env["GIT_COMMITTER_EMAIL"] and env["USER"] == env["LOGNAME"]


async def test_an_agent_whose_mcp_client_cannot_take_a_server_is_refused_before_anything_is_written(
    tmp_path: Path, examples: Path
) -> None:
    """Codex has no SSE client: refused before the run folder exists (an agent without any MCP
    client is not: it gets reroll's bridge)."""
    task = load_task(examples / "hello-file")
    server = McpServerSpec(name="mail", transport="sse", url="http://localhost:9001/sse")
    environment = task.spec.environment.model_copy(update={"mcp_servers": [server]})
    task = task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    origin = NewRecording(task, get_agent("codex"))
    with pytest.raises(AgentError, match=r"MCP servers 'mail' \(sse\), but codex's MCP client speaks only"):
        await start_rollout(
            origin, live_model=None, parent=tmp_path / "out", name="x", options=RolloutSettings()
        )
    assert not (tmp_path / "out").exists()


async def test_a_user_model_without_a_persona_and_a_persona_without_a_model_are_refused(
    tmp_path: Path, examples: Path
) -> None:
    task = load_task(examples / "greet-the-user")
    plain = NewRecording(task, get_agent("claude-code"))
    with pytest.raises(TrialError, match=r"--user-model: the trial has no persona \(a scene's `persona`\)"):
        await start_rollout(
            plain,
            live_model=None,
            parent=tmp_path / "out",
            name="x",
            options=RolloutSettings(user_model="scripted"),
        )
    persona = Scene("s", [Role("a", "claude-code")], persona=Persona(text="You read French."))
    origin = NewRecording(task, get_agent("claude-code"), TrialConfig(scenes=[persona]))
    with pytest.raises(
        ModelError, match="the trial's persona has no model: set its `model`, or pass --user-model"
    ):
        await start_rollout(
            origin, live_model=None, parent=tmp_path / "out", name="x", options=RolloutSettings()
        )
    assert not (tmp_path / "out").exists()


async def test_a_personas_benchflow_model_is_resolved_before_anything_is_written(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A persona's bare ``claude-…`` model is Anthropic's (as BenchFlow routes its User): without
    the key, refused naming ANTHROPIC_API_KEY and --user-model; nothing written."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    task = load_task(examples / "greet-the-user")
    persona = Scene("s", [Role("a", "claude-code")], persona=Persona(text="x", model="claude-sonnet-4-6"))
    origin = NewRecording(task, get_agent("claude-code"), TrialConfig(scenes=[persona]))
    with pytest.raises(ModelError) as refused:
        await start_rollout(
            origin, live_model=None, parent=tmp_path / "out", name="x", options=RolloutSettings()
        )
    message = str(refused.value)
    assert "the User's model 'claude-sonnet-4-6' (the trial persona's `model`) cannot be used" in message
    assert "needs ANTHROPIC_API_KEY" in message and "or pass --user-model SPEC" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("lines", [None, 0, 1])
def test_a_persona_recording_shorter_than_its_records_is_refused_naming_it(
    tmp_path: Path, lines: int | None
) -> None:
    asks = [
        AskRecord(
            question=f"q{n}?", index=n, step=n, asked_at="t", answer="a", answered_by="user", user_exchange=n
        )
        for n in range(2)
    ]
    trajectory = tmp_path / "trajectory" / "user_trajectory.jsonl"
    if lines is not None:
        trajectory.parent.mkdir()
        trajectory.write_text("{}\n" * lines)
    with pytest.raises(
        RunFolderError, match="name 2 exchange\\(s\\) of the persona's model before the cut"
    ) as caught:
        PersonaPlan.from_recorded(tmp_path, asks, [], live=True)
    assert str(trajectory) in str(caught.value)
    trajectory.parent.mkdir(exist_ok=True)
    trajectory.write_text("{}\n{}\n{}\n")
    assert PersonaPlan.from_recorded(tmp_path, asks[:1], [], live=False) == PersonaPlan(
        replay=trajectory, cut_index=1, live=False
    )


def test_a_continuation_binds_the_host_paths_it_takes_from_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`with_recorded_inputs`: the original's own skills folder, learner store (read-only) and
    judge script become options, so an executor sees every host path the rollout reads; what the
    rollout would not read (another skill mode, a provider's judge) is not bound."""
    original = RunConfig(
        task_path="/tasks/t",
        agent="claude-code",
        skill_mode="with-skill",
        skill_source="custom_runtime",
        effective_skills_dir="/home/u/skills",
        learner_store=StoreUse(path="/jobs/j/store", generation=3, writes_back=True),
        judge_model="scripted:/home/u/judge.yaml",
    )
    bound = with_recorded_inputs(RolloutSettings(), original)
    assert bound.skills_dir == Path("/home/u/skills")
    assert bound.learner_store == StoreUse(path="/jobs/j/store", generation=3, writes_back=False)
    assert bound.judge_model == "scripted:/home/u/judge.yaml"
    assert bound.paths_read() == (Path("/home/u/skills"), Path("/jobs/j/store"), Path("/home/u/judge.yaml"))
    given = RolloutSettings(skills_dir=Path("/other"), judge_model="scripted:rel.yaml")
    monkeypatch.chdir(tmp_path)
    bound = with_recorded_inputs(given, original)
    assert (bound.skills_dir, bound.judge_model) == (Path("/other"), f"scripted:{tmp_path / 'rel.yaml'}")
    bound = with_recorded_inputs(RolloutSettings(skill_mode="no-skill"), original)
    assert bound.skills_dir is None
    bundled = original.model_copy(update={"skill_source": "task_bundled", "judge_model": "openai/gpt-4o"})
    bound = with_recorded_inputs(RolloutSettings(), bundled)
    assert (bound.skills_dir, bound.judge_model) == (None, None)  # the task's skills travel with it


def test_a_continuation_binds_a_persona_users_script_so_it_travels() -> None:
    """The persona's model script (`RolloutSettings.user_model`): ``--user-model`` made absolute,
    else the original's ``user_model``, else the trial's persona's own script; a provider's
    model names no host path and stays unbound."""
    persona = Scene(
        "s", [Role("a", "claude-code")], persona=Persona(text="p", model="scripted:/u/persona.yaml")
    )
    original = RunConfig(task_path="/tasks/t", agent="claude-code", trial=TrialConfig(scenes=[persona]))
    bound = with_recorded_inputs(RolloutSettings(), original)
    assert bound.user_model == "scripted:/u/persona.yaml"
    assert bound.paths_read() == (Path("/u/persona.yaml"),)
    moved = bound.relocated(lambda path: Path("/worker") / path.name)
    assert moved.user_model == "scripted:/worker/persona.yaml"
    chosen = original.model_copy(update={"user_model": "scripted:/u/chosen.yaml"})
    assert with_recorded_inputs(RolloutSettings(), chosen).user_model == "scripted:/u/chosen.yaml"
    live = RolloutSettings(user_model="openai/gpt-4o")
    assert with_recorded_inputs(live, chosen).user_model == "openai/gpt-4o"
    provider = Scene("s", [Role("a", "claude-code")], persona=Persona(text="p", model="openai/gpt-4o"))
    assert (
        with_recorded_inputs(
            RolloutSettings(),
            RunConfig(task_path="/t", agent="claude-code", trial=TrialConfig(scenes=[provider])),
        ).user_model
        is None
    )
