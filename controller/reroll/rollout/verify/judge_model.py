"""A judged task's model, resolved while the rollout is planned, before any sandbox starts.

A judge verifier (``llm-judge``: `reroll.rollout.verify.judge.LlmJudgeVerifier`; ``agent-judge``:
`reroll.rollout.verify.agent_judge.AgentJudgeVerifier`) names its model in one of three places,
first found wins: ``--judge-model`` (a job's ``judge_model``), the task's verifier ``model``
(verifier.md's strategy, ``[verifier.judge] model``), the rubric's ``[judge] model``. The
name is parsed as a ``--model`` spec (`reroll.models.spec.parse_model`), so a BenchFlow task's
bare ``model: claude-sonnet-4-6`` is Anthropic's, as BenchFlow routes it. `check_judge_model`
does that at planning time: a name that cannot be used (an unknown provider, a missing key or
script) is a `ModelError` — the CLI exits with code 2 before the agent runs — whose message
names what chose it and what fixes it (the variable, or ``--judge-model``).

A task whose judge names no model at all is not refused here: its rollout runs and its verdict
is a ``verifier_error`` saying so (``reroll rescore --judge-model`` can score it later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reroll_contracts.errors import ModelError

from reroll.models.spec import ModelSpec, parse_model
from reroll.rollout.verify.verifiers import verifier_for
from reroll.tasks.task import Task

JUDGE_MODEL_FLAG = "--judge-model"
"""The flag that overrides every judge model a task names."""


@dataclass(frozen=True)
class JudgeModel:
    """The model a judge verifier would use, and where it was named."""

    spec: str
    """A ``--model`` spec; a task's relative ``scripted:PATH`` already made a path inside the task."""
    source: str
    """What named it, for messages: ``--judge-model``, ``the task's verifier model``,
    ``the rubric's [judge] model (PATH)``."""
    agent: str | None = None
    """The judge agent (whose own task script ``scripted`` reads); None: an LLM judge."""


@runtime_checkable
class JudgeVerifier(Protocol):
    """A verifier that asks a model: it tells which one before the rollout runs."""

    def judge_model(self, override: str | None) -> JudgeModel | None:
        """The model it would judge with under ``--judge-model`` `override` (None: not given);
        None: it names none (its verdict will say so)."""
        ...


def choose(
    override: str | None, task_model: str | None, rubric_model: str | None, rubric: str
) -> tuple[str, str] | None:
    """The first judge model named, and its `JudgeModel.source`: `override` (``--judge-model``),
    `task_model` (the task's verifier ``model``), `rubric_model` (the rubric at path `rubric`);
    None when none is."""
    if override is not None:
        return override, JUDGE_MODEL_FLAG
    if task_model is not None:
        return task_model, "the task's verifier model"
    if rubric_model is not None:
        return rubric_model, f"the rubric's [judge] model ({rubric})"
    return None


def judge_flag(given: str, task: Task) -> str:
    """``--judge-model`` `given` as config.json stores it (a relative ``scripted:PATH`` made
    absolute, seen from `task`'s folder).

    Raises:
        ModelError: it cannot be used; the message names ``--judge-model`` and the cause (the
            missing variable, the unknown provider).
    """
    try:
        return parse_model(given, task.path).spec
    except ModelError as exc:
        raise ModelError(f"{JUDGE_MODEL_FLAG} {given}: {exc}; or pass another {JUDGE_MODEL_FLAG}") from exc


def check_judge_model(task: Task, override: str | None) -> ModelSpec | None:
    """Resolve the model `task`'s judge would use (see the module docstring).

    Args:
        task: the task; its verifier is built (`verifier_for`) — a non-judge verifier needs no model.
        override: ``--judge-model`` (a job's ``judge_model``); None: not given.

    Returns:
        The parsed model; None for a verifier that asks no model, or a judge that names none.

    Raises:
        ModelError: the named model cannot be used; the message names the task, the model, what
            named it, the cause (the missing variable, the unknown provider) and ``--judge-model``.
        TaskError: the task's verifier cannot be built (an unknown type, invalid options, a
            missing rubric).
    """
    verifier = verifier_for(task)
    if not isinstance(verifier, JudgeVerifier):
        return None
    judge = verifier.judge_model(override)
    if judge is None:
        return None
    try:
        return parse_model(judge.spec, task.path, judge.agent)
    except ModelError as exc:
        fix = (
            f"or pass another {JUDGE_MODEL_FLAG}"
            if judge.source == JUDGE_MODEL_FLAG
            else f"or pass {JUDGE_MODEL_FLAG} SPEC (e.g. anthropic/NAME, openai/NAME, scripted:PATH)"
        )
        raise ModelError(
            f"task {task.name}: the judge model {judge.spec!r} ({judge.source}) cannot be used: {exc}; {fix}"
        ) from exc


def judge_model_warnings(task: Task) -> list[str]:
    """``reroll task check``'s warning about `task`'s judge model: the refusal a run here would
    give it (`check_judge_model` without ``--judge-model``), or none. A warning, not a failure:
    BenchFlow's ``check_task`` does not look at the judge's model (its judge finds a missing key
    when it is called, after the agent ran), and the run's environment may set the variable."""
    try:
        check_judge_model(task, None)
    except ModelError as exc:
        return [f"a run here refuses it before the agent starts (exit 2): {exc}"]
    return []
