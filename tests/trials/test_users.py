"""Users (`reroll.trials.users`): loading one a trial file names, calling it, its failures."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.trials.config import Scene
from reroll.trials.users import (
    BaseUser,
    FunctionUser,
    RoundResult,
    call_setup,
    load_user,
    next_prompt,
    user_answer,
    user_spec,
)
from reroll_contracts.errors import TrialError, UserCallbackError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "trials"


def test_the_example_user_discloses_step_by_step_and_stops_on_pass() -> None:
    user = load_user(f"{EXAMPLES / 'progressive_user.py'}:disclose")
    assert isinstance(user, FunctionUser)
    failed = RoundResult(round=0, prompt="p", rewards={"reward": 0.0}, verifier_output="FAIL: test_mean\n")
    assert user.run(0, "Spec.", None) == "Terse spec: make calc.py correct."
    assert "FAIL: test_mean" in user.run(1, "Spec.", failed)
    assert user.run(2, "Spec.", failed) == "Full spec:\nSpec."
    assert user.run(3, "Spec.", failed).startswith("Still failing")
    assert user.run(4, "Spec.", RoundResult(round=3, prompt="p", rewards={"reward": 1.0})) is None


def test_a_file_user_imports_its_siblings_and_a_class_is_instantiated(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("PROMPT = 'from a sibling'\n")
    (tmp_path / "users.py").write_text(
        "from helper import PROMPT\nfrom reroll.trials.users import BaseUser\n"
        "class Once(BaseUser):\n    def run(self, round, instruction, result):\n"
        "        return PROMPT if round == 0 else None\n"
    )
    user = load_user(f"{tmp_path / 'users.py'}:Once")
    assert isinstance(user, BaseUser) and user.run(0, "", None) == "from a sibling"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-colon", "expected module:attribute"),
        ("/no/such/file.py:f", "user file /no/such/file.py not found"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("json:no_such_attribute", "has no function or BaseUser"),
    ],
)
def test_a_bad_user_spec_is_refused_with_its_cause(spec: str, message: str) -> None:
    with pytest.raises(TrialError, match=message):
        load_user(spec)


async def test_async_users_are_awaited_and_bad_answers_are_user_errors() -> None:
    async def ask(round: int, instruction: str, result: RoundResult | None) -> str | None:
        return f"round {round}: {instruction}"

    assert await next_prompt(FunctionUser(ask), 2, "go", None) == "round 2: go"
    with pytest.raises(UserCallbackError, match=r"returned int, not str or None"):
        await next_prompt(FunctionUser(lambda *_: 7), 0, "", None)  # type: ignore[arg-type]  # the refusal tested
    with pytest.raises(UserCallbackError, match=r"round 1\) raised ZeroDivisionError"):
        await next_prompt(FunctionUser(lambda *_: str(1 / 0)), 1, "", None)

    class Broken(BaseUser):
        def setup(self, instruction: str, solution: str | None) -> None:
            raise RuntimeError("no solution")

    with pytest.raises(UserCallbackError, match="setup raised RuntimeError"):
        await call_setup(Broken(), "", None)
    assert UserCallbackError.error_category == "user_error"


def module_level_user(round: int, instruction: str, result: RoundResult | None) -> str | None:
    return "go" if round == 0 else None


def test_the_python_api_names_a_user_so_a_continuation_loads_it_again() -> None:
    spec = user_spec(module_level_user)
    assert spec == f"{__name__}:module_level_user"
    assert Scene.single("mini-swe-agent", user=module_level_user).user == spec
    assert load_user(spec).run(0, "", None) == "go"
    with pytest.raises(TrialError, match="cannot be named"):
        user_spec(lambda *_: None)


async def test_a_function_user_answers_with_its_answer_function(tmp_path: Path) -> None:
    (tmp_path / "users.py").write_text(
        "def prompts(round, instruction, result):\n    return instruction if round == 0 else None\n"
        "async def answers(question, options):\n    return options[1] if options else 'free'\n"
    )
    user = load_user(f"{tmp_path / 'users.py'}:prompts,answers")
    assert isinstance(user, FunctionUser) and user.run(0, "go", None) == "go"
    assert await user_answer(user, "which?", ["a", "b"]) == "b"
    assert await user_answer(user, "which?", []) == "free"
    assert await user_answer(FunctionUser(module_level_user), "which?", ["a"]) is None  # no answer function
    with pytest.raises(TrialError, match="has no functions 'prompts' and 'missing'"):
        load_user(f"{tmp_path / 'users.py'}:prompts,missing")
    with pytest.raises(TrialError, match="prompt_function,answer_function"):
        load_user(f"{tmp_path / 'users.py'}:prompts,")
