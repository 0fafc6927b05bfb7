"""`reroll.settings`: each setting's carry-over to a continuation, and the host paths it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reroll.runfolder.run import RunConfig, StoreUse
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.settings import (
    Carry,
    RolloutSettings,
    carry_of,
    continuation_settings,
    recorded_settings,
)
from reroll_contracts.faults import FaultsUsed

ORIGINAL: dict[str, Any] = {
    "timeout_seconds": 30.0,
    "sandbox": "docker",
    "sandbox_config": {"ready_timeout_seconds": 90},
    "network": "none",
    "environment_manifest": Path("/envs/clawsbench.toml"),
    "environment_services": ("gmail", "gcal"),
    "faults": FaultsUsed(plan_path=Path("/plans/a.yaml"), seed=1),
    "checkpoint_every": 2,
    "checkpoint_keep": 8,
    "max_steps": 7,
    "divergence_policy": "strict",
    "skill_mode": "with-skill",
    "skills_dir": Path("/home/u/skills"),
    "learner_store": StoreUse(path="/jobs/j/store", generation=1, writes_back=False),
    "judge_model": "openai/gpt-4o",
    "ask_user": True,
    "without_mcp": True,
    "user_model": "scripted:/u/user.yaml",
    "trust": ("users.py",),
}
GIVEN: dict[str, Any] = {
    "timeout_seconds": 60.0,
    "sandbox": "docker",
    "sandbox_config": {"image_map": {"a": "b"}},
    "network": "full",
    "environment_manifest": Path("/envs/env0@prod.toml"),
    "environment_services": ("slack",),
    "faults": FaultsUsed(plan_path=Path("/plans/b.yaml"), seed=2),
    "checkpoint_every": 5,
    "checkpoint_keep": 16,
    "max_steps": 9,
    "divergence_policy": "cutover",
    "skill_mode": "with-skill",
    "skills_dir": Path("/other/skills"),
    "learner_store": StoreUse(path="/jobs/k/store", generation=4, writes_back=False),
    "judge_model": "anthropic/claude-x",
    "ask_user": False,
    "without_mcp": False,
    "user_model": "openai/gpt-4o-mini",
    "trust": ("/home/u/reviewed.py",),
}


def test_every_setting_declares_its_carry_and_the_samples_cover_them() -> None:
    assert set(ORIGINAL) == set(GIVEN) == set(RolloutSettings.model_fields)
    assert {name: carry_of(name) for name in RolloutSettings.model_fields}  # each has one


@pytest.mark.parametrize("name", sorted(RolloutSettings.model_fields))
def test_a_continuation_takes_each_setting_by_its_carry(name: str) -> None:
    recorded = RolloutSettings(**ORIGINAL)
    untouched = continuation_settings(recorded, RolloutSettings())
    overridden = continuation_settings(recorded, RolloutSettings(**{name: GIVEN[name]}))
    carry = carry_of(name)
    if carry is Carry.OVERRIDABLE:
        assert getattr(untouched, name) == ORIGINAL[name]
        assert getattr(overridden, name) == GIVEN[name]
    elif carry is Carry.MERGED:  # a backend's settings model: the fields set
        assert getattr(untouched, name).model_dump(exclude_unset=True) == ORIGINAL[name]
        assert getattr(overridden, name).model_dump(exclude_unset=True) == {**ORIGINAL[name], **GIVEN[name]}
    else:
        assert getattr(untouched, name) == RolloutSettings.model_fields[name].default
        assert getattr(overridden, name) == GIVEN[name]
    assert continuation_settings(recorded, overridden) == overridden  # idempotent


def test_the_originals_backend_settings_and_skills_folder_depend_on_the_others() -> None:
    recorded = RolloutSettings(**ORIGINAL)
    elsewhere = continuation_settings(recorded, RolloutSettings(sandbox="local"))
    assert elsewhere.sandbox_config is None  # another backend: the original's are dropped
    without = continuation_settings(recorded, RolloutSettings(skill_mode="no-skill"))
    assert without.skills_dir is None  # not with-skill: the original's --skills-dir is not mounted
    store = continuation_settings(
        recorded, RolloutSettings(learner_store=StoreUse(path="/s", generation=0, writes_back=True))
    )
    assert store.learner_store == StoreUse(path="/s", generation=0, writes_back=False)


def test_the_recorded_settings_are_read_from_config_json() -> None:
    """Folders of earlier versions and of BenchFlow (no sandbox, no skills fields) load too."""
    benchflow = RunConfig(task_path="/t", agent="claude-code", model="anthropic/x", timeout_sec=600)
    assert recorded_settings(benchflow) == RolloutSettings(
        timeout_seconds=600,
        sandbox="local",
        sandbox_config=IsolatedSandboxConfig(),
        skill_mode="no-skill",
        ask_user=False,
        without_mcp=False,
    )
    bundled = RunConfig(
        task_path="/t",
        agent="a",
        skill_mode="with-skill",
        skill_source="task_bundled",
        effective_skills_dir="/t/environment/skills",
        learner_store=StoreUse(path="/s", generation=2, writes_back=True),
    )
    recorded = recorded_settings(bundled)
    assert recorded.skills_dir is None  # the task's own skills: not a --skills-dir
    assert recorded.learner_store == StoreUse(path="/s", generation=2, writes_back=False)


def test_the_host_paths_are_found_by_their_field_kind_and_relocated() -> None:
    settings = RolloutSettings(**ORIGINAL)
    assert settings.paths_read() == (
        Path("/envs/clawsbench.toml"),  # the manifest an executor on another machine carries there
        Path("/home/u/skills"),
        Path("/jobs/j/store"),
        Path("/u/user.yaml"),  # the judge is a provider's model: no file
    )
    moved = settings.relocated(lambda path: Path("/w") / path.name)
    assert moved.paths_read() == (
        Path("/w/clawsbench.toml"),
        Path("/w/skills"),
        Path("/w/store"),
        Path("/w/user.yaml"),
    )
    assert moved.user_model == "scripted:/w/user.yaml"
    shipped = {"environment_manifest": None, "skills_dir": None, "learner_store": None, "user_model": None}
    assert moved.model_copy(update=shipped) == settings.model_copy(update=shipped)


def test_the_settings_are_frozen_and_refuse_unknown_fields() -> None:
    settings = RolloutSettings()
    with pytest.raises(ValueError, match="frozen"):
        settings.sandbox = "docker"
    with pytest.raises(ValueError, match="timeout"):
        RolloutSettings(timeout=3)  # type: ignore[call-arg]


def test_a_trial_files_settings_sit_under_the_given_ones() -> None:
    from reroll.settings import recording_settings
    from reroll.trials.config import Scene, TrialConfig

    trial = TrialConfig(scenes=[Scene.single()], skills="with-skill", skills_dir=Path("/t/skills"))
    assert recording_settings(RolloutSettings(timeout_seconds=5), trial) == RolloutSettings(
        timeout_seconds=5, skill_mode="with-skill", skills_dir=Path("/t/skills")
    )
    given = RolloutSettings(skill_mode="no-skill")
    assert recording_settings(given, trial).skill_mode == "no-skill"
    assert recording_settings(given, None) is given
    assert recording_settings(given, TrialConfig(scenes=[Scene.single()])) == given


def test_backend_settings_are_parsed_once_by_the_backends_model_and_survive_ray_transport() -> None:
    """A mapping is parsed where it enters (the backend named); given without a backend it waits,
    unbound, for the backend the rollout runs on. Either form pickles (Ray) and dumps to what was
    given, which parses back to the same."""
    import pickle

    from reroll.sandbox.docker.config import DockerSandboxConfig
    from reroll.settings import UnboundSandboxConfig, recording_settings
    from reroll_contracts.errors import SandboxBackendError

    docker = RolloutSettings.model_validate(
        {"sandbox": "docker", "sandbox_config": {"image_map": {"a": "b"}}}
    )
    assert docker.sandbox_config == DockerSandboxConfig(image_map={"a": "b"})
    unbound = RolloutSettings.model_validate({"sandbox_config": {"ready_timeout_seconds": 5}})
    assert unbound.sandbox_config == UnboundSandboxConfig(given={"ready_timeout_seconds": 5})
    for settings in (docker, unbound):
        assert pickle.loads(pickle.dumps(settings)) == settings
        assert RolloutSettings.model_validate_json(settings.model_dump_json()) == settings
    assert docker.recorded_sandbox_config() == {"image_map": {"a": "b"}}  # only what was given
    assert recording_settings(unbound, None).sandbox_config == IsolatedSandboxConfig(ready_timeout_seconds=5)
    misplaced = RolloutSettings.model_validate({"sandbox_config": {"image": "x"}})  # docker's, not local's
    with pytest.raises(SandboxBackendError, match=r"(?s)sandbox 'local': invalid sandbox_config.*image"):
        recording_settings(misplaced, None)
