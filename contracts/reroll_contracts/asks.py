"""ask_user: the agent's question to the User and the answer, between the sandbox, the LLM proxy
and the controller (seeds/architecture.txt, "The interaction model — ACP": ``ask_user`` with
enumerated options, agent → client).

The path of one question: the agent calls the ``ask_user`` tool of reroll's MCP server (a stdio
server in the sandbox, `reroll.rollout.turns.ask_user_server`), which posts an `AskQuestion` to the
proxy (``POST /reroll/ask_user``, the rollout token); the proxy holds that request and hands a
`PendingAsk` to the controller (``GET /_reroll/asks``, a long poll, the controller's token); the
controller's User decides the answer and posts an `AskAnswer` (``POST /_reroll/asks/{id}``);
the proxy answers the held request with it. Nothing of the controller is reachable from the
sandbox but the proxy's port, whose controller routes the rollout token does not open.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reroll_contracts.trajectory import Place

MAX_QUESTION_CHARS = 4000
"""The longest question."""
MAX_OPTIONS = 20
"""The most options of one question."""
MAX_OPTION_CHARS = 500
"""The longest option."""
MAX_ANSWER_CHARS = 16000
"""The longest answer."""
MAX_PENDING_ASKS = 8
"""The most questions waiting for an answer at once (more are refused with 429)."""


class AskQuestion(BaseModel):
    """The ``ask_user`` tool's arguments: the body of ``POST /reroll/ask_user``."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    """What the agent asks."""
    options: list[str] = Field(default_factory=list, max_length=MAX_OPTIONS)
    """The answers it offers (none: a free answer); each non-empty, distinct."""

    @field_validator("question")
    @classmethod
    def _not_blank(cls, question: str) -> str:
        if not question.strip():
            raise ValueError("the question is blank")
        return question

    @field_validator("options")
    @classmethod
    def _distinct(cls, options: list[str]) -> list[str]:
        if any(not option.strip() or len(option) > MAX_OPTION_CHARS for option in options):
            raise ValueError(
                f"every option must be a non-blank string of at most {MAX_OPTION_CHARS} characters"
            )
        if len(set(options)) != len(options):
            raise ValueError("the options repeat")
        return options


class PendingAsk(AskQuestion):
    """A question waiting for the controller (``GET /_reroll/asks`` answers a list of them)."""

    id: int = Field(ge=0)
    """The proxy's number for it (0-based, in the order asked)."""
    step: int = Field(ge=0)
    """How many exchanges the proxy had served when it was asked: the cut index of a branch
    that answers it otherwise (``reroll branch --at-ask``)."""
    place: Place | None = None
    """Where in the trial it was asked (the proxy's current place)."""
    asked_at: str
    """When (ISO 8601, UTC)."""


class AskAnswer(BaseModel):
    """The controller's answer: the body of ``POST /_reroll/asks/{id}``, and the body the agent's
    held ``POST /reroll/ask_user`` gets."""

    model_config = ConfigDict(extra="forbid")
    answer: str = Field(max_length=MAX_ANSWER_CHARS)
