"""Uniform flags: every command that starts sandboxes takes the same sandbox, network, fault and
divergence flags, or says in its help why not; the backend's settings are checked before anything
is written, and a continuation starts from the original's."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.core
import typer.main
from reroll.cli.app import app
from reroll.runfolder.run import RunConfig
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.local.plain import LocalSandboxConfig
from reroll.settings import RolloutSettings, UnboundSandboxConfig, continuation_settings, recorded_settings
from typer import _click
from typer.testing import CliRunner

STARTS_SANDBOXES = ["run", "continue", "continue-job", "replay", "branch", "job"]
SANDBOX_FLAGS = {"--sandbox", "--sandbox-config", "--image-map", "--network"}
FAULT_FLAGS = {"--faults", "--fault-seed"}
DIVERGENCE_FLAGS = {"--on-divergence", "--strict-divergence"}


def command(name: str) -> _click.Command:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    found = group.commands[name]
    return found


@pytest.mark.parametrize("name", STARTS_SANDBOXES)
def test_every_command_that_starts_sandboxes_takes_the_same_flags_or_says_why_not(name: str) -> None:
    cmd = command(name)
    flags = {option for param in cmd.params for option in param.opts}
    assert flags >= SANDBOX_FLAGS
    help_text = " ".join((cmd.help or "").split())
    for group, why in ((FAULT_FLAGS, "No --faults"), (DIVERGENCE_FLAGS, "No --on-divergence")):
        assert group <= flags or (not group & flags and why in help_text), (name, group & flags)


def invoke(*args: str, cwd: Path) -> tuple[int, str]:
    done = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)
    return done.exit_code, done.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sandbox-config", "[1]"], "--sandbox-config: expected a JSON object"),
        (["--sandbox-config", "{nope"], "--sandbox-config: not JSON"),
        (["--image-map", "a=b", "--sandbox", "local-plain"], "sandbox 'local-plain': invalid sandbox_config"),
        (["--sandbox", "local-plain", "--sandbox-config", '{"ready_timeout_seconds": "x"}'], "ready_timeout"),
    ],
)
def test_bad_backend_settings_exit_2_before_anything_is_written(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = invoke("run", str(examples / "hello-file"), "--agent", "oracle", *flags, cwd=tmp_path)
    assert code == 2 and message in output, output
    assert list(tmp_path.iterdir()) == []


def _sandbox_config(original: RunConfig, given: RolloutSettings) -> dict[str, object]:
    """The backend settings a continuation of `original` runs with, given `given` (the fields set)."""
    settings = continuation_settings(recorded_settings(original), given).sandbox_config
    return settings.model_dump(exclude_unset=True) if settings is not None else {}


def test_a_continuation_starts_from_the_originals_settings_on_the_same_backend() -> None:
    original = RunConfig(
        task_path="/t",
        agent="oracle",
        sandbox="docker",
        sandbox_config={"image_map": {"ubuntu:24.04": "reroll/base:bookworm"}, "ready_timeout_seconds": 90},
    )
    assert _sandbox_config(original, RolloutSettings()) == original.sandbox_config
    override = RolloutSettings(sandbox="docker", sandbox_config=DockerSandboxConfig(image_map={"a": "b"}))
    assert _sandbox_config(original, override) == {"image_map": {"a": "b"}, "ready_timeout_seconds": 90}
    elsewhere = RolloutSettings(
        sandbox="local-plain", sandbox_config=LocalSandboxConfig(ready_timeout_seconds=5)
    )
    assert _sandbox_config(original, elsewhere) == {"ready_timeout_seconds": 5}
    assert _sandbox_config(original, RolloutSettings(sandbox="local")) == {}


def test_prune_goes_through_the_named_backend(tmp_path: Path) -> None:
    code, output = invoke("sandbox", "prune", "--sandbox", "local-plain", cwd=tmp_path)
    assert code == 0 and "nothing to prune for the local-plain sandbox" in output, output
    code, output = invoke("sandbox", "prune", "--sandbox", "lokal", cwd=tmp_path)
    assert code == 2 and "unknown sandbox backend 'lokal'" in output, output


def test_every_setting_has_a_flag_and_run_and_job_take_every_one_a_recording_uses() -> None:
    """The settings' flags are declared once (`reroll.cli.flags.FLAGS`); ``reroll run`` and
    ``reroll job`` take each one that a recording uses (not the divergence flags: a recording
    replays nothing; not ``--trust``: a recording runs only what its command names), so a job runs
    whatever a run can."""
    from reroll.cli.flags import FLAGS

    assert set(FLAGS.values()) == set(RolloutSettings.model_fields) - {"learner_store"}
    recording = set(FLAGS) - {"on_divergence", "strict_divergence", "trust"}
    for name in ("run", "job"):
        params = {param.name for param in command(name).params}
        assert recording <= params, f"{name}: {recording - params}"


def test_the_flags_build_the_settings(tmp_path: Path) -> None:
    from reroll.cli.flags import rollout_settings

    settings = rollout_settings(
        {"timeout": 9.0, "image_map": ["a=b"], "skills": "no-skill", "checkpoint_every": 2, "model": "x"}
    )
    assert settings == RolloutSettings(
        timeout_seconds=9.0,
        sandbox_config=UnboundSandboxConfig(given={"image_map": {"a": "b"}}),
        skill_mode="no-skill",
        checkpoint_every=2,
    )
    assert rollout_settings({"on_divergence": None, "strict_divergence": True}).divergence_policy == "strict"


def test_the_backend_flags_reach_the_settings_as_the_backends_own_model() -> None:
    """One typed path: ``--sandbox docker --image-map`` parsed once, by docker's model."""
    from reroll.cli.flags import rollout_settings
    from reroll.sandbox.docker.config import DockerSandboxConfig

    settings = rollout_settings(
        {"sandbox": "docker", "image_map": ["a=b"], "sandbox_config": '{"image": "x"}'}
    )
    assert settings.sandbox_config == DockerSandboxConfig(image="x", image_map={"a": "b"})
