"""Model specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.errors import ModelError
from reroll.models import model_name, parse_model


def test_a_scripted_path_is_stored_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s.yaml").write_text("turns: [{content: hi}]\n")
    monkeypatch.chdir(tmp_path)
    model = parse_model("scripted:s.yaml", None)
    assert model.spec == f"scripted:{tmp_path / 's.yaml'}" and model.script == tmp_path / "s.yaml"
    assert model.name == "scripted"


def test_the_task_script_keeps_its_short_spec(examples: Path) -> None:
    model = parse_model("scripted", examples / "fix-failing-test")
    assert model.spec == "scripted" and model.script == examples / "fix-failing-test" / "scripted-model.yaml"


def test_a_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"script file .*nope\.yaml not found"):
        parse_model(f"scripted:{tmp_path / 'nope.yaml'}", None)


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("scripted", "scripted"),
        ("scripted:/gone.yaml", "scripted"),
        ("openai/gpt-4o", "gpt-4o"),
        ("gemini-3", "gemini-3"),
    ],
)
def test_model_name_needs_no_provider(spec: str, name: str) -> None:
    assert model_name(spec) == name
