"""Users: Python callbacks that drive a multi-round scene (seeds/concepts.txt, "The User abstraction").

A User watches each round and decides the next prompt: `BaseUser` (subclass it) or
`FunctionUser` (wrap a function). ``setup(instruction, solution)`` is called once when the
scene starts; ``run(round, instruction, round_result)`` before each round — round 0 with
``round_result`` None, round N+1 with the `RoundResult` of round N (its exchanges, the soft
verify's rewards and output) — and returns the round's prompt, or None to end the scene. Both
may be coroutines.

A `BaseUser` also answers the agent's ask_user questions (``answer(question, options)``, when
the run offers the tool: `reroll.rollout.turns.asks`); the default answers none. A `FunctionUser`
answers with its optional answer function (``FILE.py:prompts,answers`` in a trial file). A
User played by a model is a trial scene's ``persona`` (`reroll.rollout.turns.persona`).

A continuation re-sends the prompts the User decided before the cut (recorded in ``trial.json``)
without calling ``run``; ``run`` is called live from the first round after the cut (``setup``
is called once either way, so a User keeping state should derive it from ``round`` and
``round_result``).

A trial file names its User as ``package.module:attribute`` or ``path/to/file.py:attribute``
(`load_user`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from reroll_contracts.errors import InfrastructureError, TrialError, UserCallbackError
from reroll_contracts.trajectory import Exchange


@dataclass(frozen=True)
class RoundResult:
    """What a User sees of a finished round."""

    round: int
    """The round (0-based)."""
    prompt: str
    """What the agent was told."""
    trajectory: list[Exchange] = field(default_factory=list)
    """The round's LLM exchanges, in order."""
    rewards: dict[str, float] | None = None
    """The soft verify's rewards (None when it left none: see `verifier_error`)."""
    verifier_output: str = ""
    """The test script's stdout and stderr."""
    verifier_error: str | None = None
    """Why the soft verify left no reward, if so."""
    exit_code: int | None = None
    """The agent's exit code."""

    @property
    def n_exchanges(self) -> int:
        """How many LLM exchanges the round made."""
        return len(self.trajectory)


UserFunction = Callable[[int, str, "RoundResult | None"], "str | Awaitable[str | None] | None"]
"""A `FunctionUser`'s function: ``(round, instruction, round_result)`` → the prompt or None."""
AnswerFunction = Callable[[str, list[str]], "str | Awaitable[str | None] | None"]
"""A `FunctionUser`'s answer function: ``(question, options)`` → the answer or None."""


class BaseUser:
    """A User: subclass it and override `run` (and `setup` to see the instruction and solution)."""

    def setup(self, instruction: str, solution: str | None) -> Any:
        """Called once before round 0.

        Args:
            instruction: the task's instruction.
            solution: the task's oracle solution script (``solve.sh``) text, None when it has none.
        """

    def run(self, round: int, instruction: str, round_result: RoundResult | None) -> Any:
        """The prompt of `round` (a str), or None to end the scene; may be a coroutine.

        Args:
            round: 0-based.
            instruction: the task's instruction.
            round_result: the previous round's result; None for round 0.
        """
        raise NotImplementedError

    def answer(self, question: str, options: list[str]) -> Any:
        """The answer to the agent's ask_user question (a str), or None for no answer (the agent
        is told nobody answered); may be a coroutine. The default answers nothing.

        Args:
            question: what the agent asked.
            options: the answers it offered (empty: a free answer).
        """
        return None


class FunctionUser(BaseUser):
    """A User from a function ``fn(round, instruction, round_result) -> str | None`` (sync or
    async), and optionally one answering ask_user questions, ``answer_fn(question, options) ->
    str | None`` (sync or async; without it, no question is answered)."""

    def __init__(self, fn: UserFunction, answer_fn: AnswerFunction | None = None) -> None:
        self.fn = fn
        self.answer_fn = answer_fn

    def run(self, round: int, instruction: str, round_result: RoundResult | None) -> Any:
        return self.fn(round, instruction, round_result)

    def answer(self, question: str, options: list[str]) -> Any:
        return self.answer_fn(question, options) if self.answer_fn is not None else None


async def call_setup(user: BaseUser, instruction: str, solution: str | None) -> None:
    """``user.setup(...)``, awaited when it is a coroutine.

    Raises:
        UserCallbackError: it raised.
    """
    try:
        done = user.setup(instruction, solution)
        if inspect.isawaitable(done):
            await done
    except Exception as exc:
        raise UserCallbackError(f"the User's setup raised {exc!r}") from exc


async def next_prompt(user: BaseUser, round: int, instruction: str, result: RoundResult | None) -> str | None:
    """The prompt `user` decides for `round` (None: end the scene).

    Raises:
        UserCallbackError: ``run`` raised, or returned something but a string or None.
    """
    return await _text_from(lambda: user.run(round, instruction, result), f"the User's run (round {round})")


async def user_answer(user: BaseUser, question: str, options: list[str]) -> str | None:
    """The answer `user` gives to an ask_user question (None: no answer).

    Raises:
        UserCallbackError: ``answer`` raised, or returned something but a string or None.
    """
    return await _text_from(lambda: user.answer(question, options), f"the User's answer to {question!r}")


async def _text_from(callback: Callable[[], Any], what: str) -> str | None:
    """What `callback` returns (awaited when it is a coroutine): a string or None.

    Raises:
        UserCallbackError: it raised, or returned something else (`what` names it).
        InfrastructureError: it raised one (a model it asks could not be reached).
    """
    try:
        text = callback()
        if inspect.isawaitable(text):
            text = await text
    except InfrastructureError:
        raise  # a model the User asks could not be reached: the infrastructure's, not the User's
    except Exception as exc:
        raise UserCallbackError(f"{what} raised {exc!r}") from exc
    if text is not None and not isinstance(text, str):
        raise UserCallbackError(f"{what} returned {type(text).__name__}, not str or None")
    return text


def load_user(spec: str) -> BaseUser:
    """The User that `spec` names.

    Args:
        spec: ``package.module:attribute`` (importable) or ``/path/to/file.py:attribute``; the
            attribute is a `BaseUser` subclass (instantiated without arguments), a `BaseUser`
            instance, or a function (wrapped in `FunctionUser`); ``…:prompts,answers`` names a
            function deciding the prompts and one answering ask_user questions (`FunctionUser`'s
            `AnswerFunction`). A file's folder is put on ``sys.path`` (as Python does for a
            script), so it imports the modules beside it.

    Raises:
        TrialError: `spec` is malformed, the module or file cannot be imported, an attribute is
            missing or is none of those (an answer function: not a function).
    """
    target, colon, attribute = spec.rpartition(":")
    attribute, comma, answers = attribute.partition(",")
    if not colon or not target or not attribute or (comma and not answers):
        raise TrialError(
            f"user {spec!r}: expected module:attribute, path/to/file.py:attribute or "
            "path/to/file.py:prompt_function,answer_function"
        )
    try:
        module = _import_file(Path(target)) if target.endswith(".py") else importlib.import_module(target)
    except TrialError:
        raise
    except Exception as exc:  # the module's own code may raise anything
        raise TrialError(f"user {spec!r}: cannot import {target}: {exc!r}") from exc
    found = getattr(module, attribute, None)
    if comma:
        answer_fn = getattr(module, answers, None)
        if (
            not callable(found)
            or isinstance(found, type)
            or not callable(answer_fn)
            or isinstance(answer_fn, type)
        ):
            raise TrialError(f"user {spec!r}: {target} has no functions {attribute!r} and {answers!r}")
        return FunctionUser(cast(UserFunction, found), cast(AnswerFunction, answer_fn))
    if isinstance(found, type) and issubclass(found, BaseUser):
        return found()
    if isinstance(found, BaseUser):
        return found
    if callable(found):
        return FunctionUser(cast(UserFunction, found))
    raise TrialError(f"user {spec!r}: {target} has no function or BaseUser {attribute!r}")


def user_spec(user: UserFunction | type[BaseUser]) -> str:
    """The spec (`load_user`) naming a module-level function or `BaseUser` subclass: how the
    Python API puts a User into a `reroll.trials.config.Scene` (a spec is what config.json records, and
    what a continuation loads again). One defined in the script Python runs (``__main__``) is
    named by that script's file.

    Raises:
        TrialError: `user` has no importable name (a lambda, a nested function, a script without a file).
    """
    module, name = getattr(user, "__module__", None), getattr(user, "__qualname__", "")
    if not module or not name or "<" in name:
        raise TrialError(f"user {user!r}: not a module-level function or class, so it cannot be named")
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        if script is None:
            raise TrialError(f"user {name}: defined in {module} without a file; put it in a module")
        return f"{Path(script).resolve()}:{name}"
    return f"{module}:{name}"


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise TrialError(f"user file {path} not found")
    name = f"reroll_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TrialError(f"user file {path}: not importable")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if (folder := str(path.resolve().parent)) not in sys.path:
        sys.path.append(folder)  # as Python runs a script: the file imports its siblings
    spec.loader.exec_module(module)
    return module
