"""The proxy's ask_user desk: holds the agent's questions until the controller answers them
(`reroll_contracts.asks` describes the whole path).

- ``POST /reroll/ask_user`` (the rollout token: the agent's MCP server, or the agent itself) —
  an `AskQuestion`; held until the controller answers, then ``{"answer": ...}`` (an
  `AskAnswer`). 400 ``{"error": ...}`` for a body that is not a valid question (the message
  says which field and why), 429 when `MAX_PENDING_ASKS` are waiting already.
- ``GET /_reroll/asks?wait=SECONDS`` (the controller's token) — the questions not yet handed
  out, as a JSON list of `PendingAsk`; waits up to ``wait`` seconds (default 20, at most 60)
  for one, then answers ``[]``.
- ``POST /_reroll/asks/{id}`` (the controller's token) — an `AskAnswer` for question ``id``:
  204; 404 when no such question waits (unknown, answered, or its agent gave up), 400 for a
  body that is not an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import orjson
from pydantic import ValidationError
from reroll_contracts.asks import MAX_PENDING_ASKS, AskAnswer, AskQuestion, PendingAsk
from reroll_contracts.trajectory import Place

from reroll_proxy.messages import Request, Response, json_response

DEFAULT_WAIT_SECONDS = 20.0
MAX_WAIT_SECONDS = 60.0


class AskDesk:
    """The questions of one proxy.

    Args:
        next_step: how many exchanges the proxy has served (the engine's next step).
        place: where in the trial the proxy is now.
    """

    def __init__(self, next_step: Callable[[], int], place: Callable[[], Place | None]) -> None:
        self._next_step = next_step
        self._place = place
        self._asked = 0
        self._waiting: dict[int, asyncio.Future[str]] = {}
        self._handed_out: asyncio.Queue[PendingAsk] = asyncio.Queue()

    async def ask(self, request: Request) -> Response:
        """The agent's question: held until answered."""
        try:
            question = AskQuestion.model_validate(orjson.loads(await request.read()))
        except orjson.JSONDecodeError as exc:
            return _error(400, f"ask_user: the body is not JSON ({exc})")
        except ValidationError as exc:
            return _error(400, f"ask_user: invalid arguments: {_reasons(exc)}")
        if len(self._waiting) >= MAX_PENDING_ASKS:
            return _error(
                429, f"ask_user: {MAX_PENDING_ASKS} questions are waiting already; wait for their answers"
            )
        number, self._asked = self._asked, self._asked + 1
        answered: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[number] = answered
        pending = PendingAsk(
            **question.model_dump(),
            id=number,
            step=self._next_step(),
            place=self._place(),
            asked_at=datetime.now(UTC).isoformat(),
        )
        self._handed_out.put_nowait(pending)
        try:
            answer = await answered
        finally:
            self._waiting.pop(number, None)
        return Response(body=AskAnswer(answer=answer).model_dump_json(), content_type="application/json")

    async def pending(self, request: Request) -> Response:
        """The controller's long poll: the questions not handed out yet."""
        try:
            wait = min(float(request.query.get("wait", DEFAULT_WAIT_SECONDS)), MAX_WAIT_SECONDS)
        except ValueError:
            return _error(400, "wait: not a number of seconds")
        found: list[PendingAsk] = []
        with contextlib.suppress(TimeoutError):
            found.append(await asyncio.wait_for(self._handed_out.get(), timeout=max(wait, 0.0)))
        while not self._handed_out.empty():
            found.append(self._handed_out.get_nowait())
        body = b"[" + b",".join(ask.model_dump_json().encode() for ask in found) + b"]"
        return Response(body=body, content_type="application/json")

    async def answer(self, request: Request) -> Response:
        """The controller's answer to question ``id``."""
        try:
            answer = AskAnswer.model_validate(orjson.loads(await request.read()))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            return _error(400, f"not an answer: {exc}")
        waiting = (
            self._waiting.get(int(request.match_info["id"])) if request.match_info["id"].isdigit() else None
        )
        if waiting is None or waiting.done():
            return _error(404, f"no question {request.match_info['id']!r} is waiting for an answer")
        waiting.set_result(answer.answer)
        return Response(status=204)


def _error(status: int, message: str) -> Response:
    return json_response({"error": message}, status=status)


def _reasons(exc: ValidationError) -> str:
    """`exc`'s errors as ``field: message`` pairs, one line."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}" for error in exc.errors()
    )
