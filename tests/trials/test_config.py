"""The trial model (`reroll.trials.config`): scenes, roles, turns; trial files; their refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from reroll.agents import get_agent
from reroll.rollout.checkpoint import first_step, recorded_turns, trial_cut
from reroll.rollout.skills import self_gen_trial
from reroll.rollout.turns.scenes import check_trial, with_messages
from reroll.runfolder.run import load_run_folder
from reroll.runfolder.trial import TrialRecord, TurnRecord
from reroll.trials.config import Role, Scene, TrialConfig, Turn, load_trial
from reroll_contracts.errors import RunFolderError, TrialError
from reroll_contracts.trajectory import Place

from tests.runfolder.test_run import exchange_line, make_run_folder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "trials"


def test_scene_single_is_one_role_told_the_instruction() -> None:
    scene = Scene.single("mini-swe-agent", "scripted")
    assert scene.roles == [Role("agent", "mini-swe-agent", "scripted")]
    assert scene.turns == [Turn("agent", None)]
    user_scene = Scene.single("mini-swe-agent", user="users:disclose", max_rounds=3)
    assert user_scene.turns == [] and user_scene.user == "users:disclose" and user_scene.max_rounds == 3


@pytest.mark.parametrize(
    ("scene", "message"),
    [
        (lambda: Scene("s", [], [Turn("a")]), "no roles"),
        (lambda: Scene("s", [Role("a"), Role("a")], [Turn("a")]), "role names repeat"),
        (lambda: Scene("s", [Role("a")], [Turn("b")]), "unknown role 'b'"),
        (lambda: Scene("s", [Role("a")], []), "no turns"),
        (lambda: Scene("s", [Role("a")], [Turn("a", "x", resume=True)]), "resume needs an earlier turn"),
        (lambda: Scene("s", [Role("a"), Role("b")], [], user="u:f"), "a User drives one role"),
    ],
)
def test_an_inconsistent_scene_is_refused_with_its_cause(scene: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        scene()  # type: ignore[operator]


def test_resolved_fills_agents_and_the_one_live_model() -> None:
    trial = TrialConfig(
        scenes=[
            Scene("a", [Role("x", model="scripted")], [Turn("x")]),
            Scene("b", [Role("y", "codex")], [Turn("y")]),
        ]
    )
    resolved = trial.resolved("mini-swe-agent", None)
    assert resolved.agents == ["mini-swe-agent", "codex"] and resolved.model == "scripted"
    assert resolved.resolved(None, None) == resolved  # idempotent
    assert trial.resolved("mini-swe-agent", "openai/gpt-x").model == "openai/gpt-x"  # --model wins
    with pytest.raises(TrialError, match="role 'x': no agent"):
        trial.resolved(None, None)
    two = TrialConfig(scenes=[Scene("a", [Role("x", "m", "one"), Role("y", "m", "two")], [Turn("x")])])
    with pytest.raises(TrialError, match="different models"):
        two.resolved(None, None)


def test_a_trial_file_anchors_its_task_user_and_script_at_its_folder() -> None:
    trial = load_trial(EXAMPLES / "progressive-disclosure.yaml")
    assert trial.task == (EXAMPLES.parent / "tasks" / "fix-failing-test").resolve()
    (scene,) = trial.scenes
    assert scene.user == f"{(EXAMPLES / 'progressive_user.py').resolve()}:disclose"
    assert scene.roles[0].model == f"scripted:{(EXAMPLES / 'progressive-disclosure.script.yaml').resolve()}"
    for name in ("coder-reviewer.yaml", "skill-gen-solve.yaml"):
        assert load_trial(EXAMPLES / name).task == trial.task


def test_a_scenes_reset_environment_survives_loading_and_resolving(tmp_path: Path) -> None:
    """``reset_environment`` (BenchFlow's ``reset()`` before a scene) is kept by `load_trial`,
    `TrialConfig.resolved` and the skill-creator's solver scene, which rebuild the scenes."""
    path = tmp_path / "trial.yaml"
    path.write_text(
        "scenes:\n  - {name: a, roles: [{name: x}], turns: [{role: x}]}\n"
        "  - {name: b, reset_environment: true, roles: [{name: y}], turns: [{role: y}]}\n"
    )
    trial = load_trial(path).resolved("oracle", None)
    assert [scene.reset_environment for scene in trial.scenes] == [False, True]
    single = TrialConfig(
        scenes=[Scene(roles=[Role("x", "oracle")], turns=[Turn("x")], reset_environment=True)]
    )
    assert self_gen_trial(single, "Do it.").scenes[1].reset_environment


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read the trial file"),
        ("scenes: [", "not valid YAML"),
        ("- a list", "a trial file is a mapping"),
        ("scenes: []", "not a valid trial file"),
        ("scenes: [{roles: [{name: a}], turns: [{role: a}]}]\nextra: 1", "extra"),
    ],
)
def test_a_bad_trial_file_is_refused_naming_it(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "trial.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TrialError, match=message) as caught:
        load_trial(path)
    assert str(path) in str(caught.value)


def test_resume_on_an_agent_without_sessions_is_refused_and_allowed_on_one_with() -> None:
    trial = TrialConfig(scenes=[Scene("s", [Role("a")], [Turn("a"), Turn("a", "now a test", resume=True)])])
    mini = trial.resolved("mini-swe-agent", None)
    with pytest.raises(TrialError, match="mini-swe-agent, which has no session to resume"):
        check_trial(mini, {"mini-swe-agent": get_agent("mini-swe-agent")})
    for agent in ("claude-code", "codex"):
        check_trial(trial.resolved(agent, None), {agent: get_agent(agent)})


def test_outbox_messages_follow_the_prompt() -> None:
    assert with_messages("Fix it.", []) == "Fix it."
    assert with_messages("Fix it.", ["From reviewer: use len"]) == (
        "Fix it.\n\nMessages for you from the other roles:\n- From reviewer: use len"
    )


def placed_line(step: int, turn: int) -> str:
    line = json.loads(exchange_line(step))
    line["metadata"] = {"step": step, "place": {"turn": turn, "scene": "s", "role": "a", "round": turn}}
    return json.dumps(line)


def recorded_run(tmp_path: Path) -> Path:
    """A run of three rounds with 2, 0 and 3 exchanges."""
    folder = make_run_folder(tmp_path / "run", [placed_line(i, t) for i, t in enumerate([0, 0, 2, 2, 2])])
    turns = [
        TurnRecord(
            place=Place(turn=t, scene="s", role="a", round=t),
            prompt=f"p{t}",
            prompt_source="user",
            status="ok",
        )
        for t in range(3)
    ]
    (folder / "trial.json").write_text(TrialRecord(turns=turns).model_dump_json())
    return folder


def test_turn_step_names_a_cut_and_the_recorded_prompts_resent(tmp_path: Path) -> None:
    original = load_run_folder(recorded_run(tmp_path))
    turns = recorded_turns(original)
    assert [turn.prompt for turn in turns] == ["p0", "p1", "p2"]
    assert [first_step(original.exchanges, t) for t in range(3)] == [0, 2, 2]
    assert trial_cut("0:0", turns, original) == (0, 1)
    assert trial_cut("0:2", turns, original) == (2, 1)  # the end of round 0: the User decides round 1
    assert trial_cut("1:0", turns, original) == (2, 2)
    assert trial_cut("2:3", turns, original) == (5, 3)
    for bad, message in [
        ("3:0", "TURN must be within 0..2"),
        ("0:3", "STEP must be within 0..2"),
        ("a:b", "two integers"),
    ]:
        with pytest.raises(RunFolderError, match=message):
            trial_cut(bad, turns, original)


def test_a_run_without_trial_json_is_one_turn_of_its_first_prompt(tmp_path: Path) -> None:
    original = load_run_folder(make_run_folder(tmp_path / "bf", [exchange_line(0)]))
    (turn,) = recorded_turns(original)
    assert turn.prompt == "do it" and turn.place == Place(turn=0, scene="main", role="agent")
    (original.path / "trial.json").write_text("{")
    with pytest.raises(RunFolderError, match=r"trial\.json: invalid"):
        recorded_turns(original)


def test_a_user_that_cannot_be_loaded_is_refused_before_anything_runs(tmp_path: Path) -> None:
    trial = TrialConfig(scenes=[Scene.single("mini-swe-agent", user=f"{tmp_path / 'missing.py'}:f")])
    with pytest.raises(TrialError, match=r"missing\.py not found"):
        check_trial(trial, {"mini-swe-agent": get_agent("mini-swe-agent")})


def test_a_persona_trial_file_reads_its_text_and_anchors_its_model() -> None:
    trial = load_trial(EXAMPLES / "ask-a-persona.yaml")
    (scene,) = trial.scenes
    assert scene.user is None and scene.driven and trial.persona is scene.persona
    assert scene.persona is not None and scene.persona.file is None
    assert scene.persona.text == (EXAMPLES / "persona" / "french-reader.md").read_text()
    assert scene.persona.model == f"scripted:{(EXAMPLES / 'persona' / 'french-reader.script.yaml').resolve()}"
    assert scene.persona.timeout_sec == 120.0
    assert TrialConfig.model_validate_json(trial.model_dump_json()) == trial  # config.json round trip


@pytest.mark.parametrize(
    ("persona", "message"),
    [
        ("{}", "a persona has either text or file"),
        ("{text: a, file: b.md}", "a persona has either text or file"),
        ("{text: a, voice: b}", "voice"),
        ("{text: a, timeout_sec: 0}", "greater than 0"),
        ("{file: missing.md}", "persona file .*missing.md: cannot be read"),
        ("{text: '  '}", "the persona's text is empty"),
    ],
)
def test_a_bad_persona_is_refused_naming_the_trial_file(tmp_path: Path, persona: str, message: str) -> None:
    path = tmp_path / "trial.yaml"
    path.write_text(f"scenes: [{{name: s, roles: [{{name: a}}], persona: {persona}}}]\n")
    with pytest.raises(TrialError, match=message) as caught:
        load_trial(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("scenes", "message"),
    [
        ("[{roles: [{name: a}], user: 'u:f', persona: {text: p}}]", "a user or a persona, not both"),
        ("[{roles: [{name: a}], turns: [{role: a}], persona: {text: p}}]", "a User drives one role"),
        (
            "[{name: x, roles: [{name: a}], persona: {text: p}},"
            " {name: y, roles: [{name: a}], persona: {text: q}}]",
            r"scenes \['x', 'y'\] each have a persona: one persona per trial",
        ),
    ],
)
def test_a_persona_scene_must_be_a_one_role_user_scene(tmp_path: Path, scenes: str, message: str) -> None:
    path = tmp_path / "trial.yaml"
    path.write_text(f"scenes: {scenes}\n")
    with pytest.raises(TrialError, match=message):
        load_trial(path)


def test_user_files_are_the_users_a_file_holds() -> None:
    """The host files a trial's rollout imports (a Ray worker cannot: `reroll.jobs.runner`)."""
    trial = TrialConfig(
        scenes=[
            Scene.single("mini-swe-agent", user="/home/u/users.py:disclose", max_rounds=2),
            Scene("b", [Role("r", "mini-swe-agent")], [], user="users:disclose", max_rounds=2),
            Scene("c", [Role("r", "mini-swe-agent")], [Turn("r")]),
        ]
    )
    assert trial.user_files() == ["/home/u/users.py:disclose"]
