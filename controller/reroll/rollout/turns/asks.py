"""ask_user in a rollout (``reroll run --ask-user``): reroll's MCP server offered to the agent, and
the `Answerer` that answers its questions while a turn runs.

The agent's MCP client starts `reroll.rollout.turns.ask_user_server` in the sandbox (a stdio server:
the file is copied into the sandbox's agent logs and run by its ``python3``); a question goes to
the LLM proxy, which holds it for the controller (`reroll_contracts.asks`). During each turn
`answering` polls the proxy and answers each question:

- in a continuation, the questions the original asked before the cut get the original's answers
  (``recorded``): the exchange that carries the answer is replayed;
- in a branch of ``--at-ask N`` (the cut is question N's step), question N gets the branch's
  answer (``branch``);
- else the scene's User answers (`reroll.trials.users.BaseUser.answer`, ``user``); with no User, or
  one that gives None, the agent is told nobody answered (``nobody``).

A persona User (`reroll.rollout.turns.persona`) is asked again for a recorded question its model
answered (the record's ``user_exchange``): its proxy serves the recorded exchange, so the answer
is the original's and the persona's conversation goes on as the original's did; every other
answer joins its conversation (`reroll.rollout.turns.persona.PersonaUser.heard`).

Each question and its answer go to ``asks.json`` in the run folder with its step and place
(`reroll.runfolder.asks`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from reroll_contracts.asks import PendingAsk
from rich.console import Console
from rich.markup import escape

from reroll.host.llm_proxy import LlmProxy
from reroll.rollout.turns.persona import PersonaUser
from reroll.runfolder.asks import AnsweredBy, AskLog, AskRecord
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import write_json
from reroll.sandbox.base import Sandbox
from reroll.tasks.environment import McpServerSpec
from reroll.trials.users import BaseUser, user_answer

SERVER_SOURCE = Path(__file__).with_name("ask_user_server.py")
"""The MCP server's source, copied into the sandbox as it is."""
SERVER_NAME = "reroll"
"""The MCP server's name: Claude Code calls its tool ``mcp__reroll__ask_user``."""
NO_ANSWER = "Nobody answered: no user is available. Decide yourself and say what you assumed."
"""What the agent is told when there is no User to ask."""
Outcome = TypeVar("Outcome")


@dataclass
class Answerer:
    """Answers one rollout's ask_user questions (see the module docstring) and records them."""

    run_dir: Path
    recorded: list[AskRecord] = field(default_factory=list)
    """The original's questions before the cut, answered again as recorded (a continuation)."""
    branch_answer: str | None = None
    """The answer to the first question after them (a branch of ``--at-ask``)."""
    asks: list[AskRecord] = field(default_factory=list)
    """This run's questions so far."""

    async def answer(self, pending: PendingAsk, user: BaseUser | None) -> AskRecord:
        """Answer `pending` and append it to ``asks.json``.

        Raises:
            UserCallbackError: the User's ``answer`` raised or returned a non-string.
        """
        index = len(self.asks)
        answer: str | None
        by: AnsweredBy
        exchange: int | None = None
        persona = user if isinstance(user, PersonaUser) else None
        if index < len(self.recorded) and self.recorded[index].user_exchange is not None and persona:
            # the persona's model gave it: its proxy serves the recorded exchange again
            answer, by = await user_answer(persona, pending.question, pending.options), "recorded"
            exchange = persona.exchanges - 1
        elif index < len(self.recorded):
            answer, by = self.recorded[index].answer, "recorded"
        elif index == len(self.recorded) and self.branch_answer is not None:
            answer, by = self.branch_answer, "branch"
        else:
            exchanges = persona.exchanges if persona else 0
            answer = await user_answer(user, pending.question, pending.options) if user is not None else None
            by = "user" if answer is not None else "nobody"
            exchange = persona.exchanges - 1 if persona and persona.exchanges > exchanges else None
        if persona is not None and exchange is None and answer is not None:
            persona.heard(pending.question, pending.options, answer)
        record = AskRecord(
            **pending.model_dump(exclude={"id"}),
            index=index,
            answer=answer or NO_ANSWER,
            answered_by=by,
            user_exchange=exchange,
        )
        self.asks.append(record)
        write_json(RunPaths(self.run_dir).asks, AskLog(asks=self.asks))
        return record

    async def serve(self, proxy: LlmProxy, user: BaseUser | None, console: Console) -> None:
        """Answer the agent's questions as they come, until cancelled.

        Raises:
            UserCallbackError: as `answer`.
            InfrastructureError: the proxy died.
        """
        while True:
            for pending in await proxy.next_asks():
                record = await self.answer(pending, user)
                said = escape(f"{record.question!r} -> {record.answer!r}")  # the agent's text: no markup
                console.print(
                    f"[dim]ask_user {record.index} at step {record.step}: {said} ({record.answered_by})[/dim]"
                )
                await proxy.answer_ask(pending.id, record.answer)


async def answering(
    turn: Awaitable[Outcome],
    answerer: Answerer | None,
    proxy: LlmProxy | None,
    user: BaseUser | None,
    console: Console,
) -> Outcome:
    """Run `turn` while `answerer` answers the agent's questions (just `turn` when the rollout
    offers no ask_user).

    Raises:
        UserCallbackError, InfrastructureError: answering failed (`Answerer.serve`); the turn is
            cancelled.
    """
    if answerer is None or proxy is None:
        return await turn
    running = asyncio.ensure_future(turn)
    desk = asyncio.ensure_future(answerer.serve(proxy, user, console))
    try:
        await asyncio.wait([running, desk], return_when=asyncio.FIRST_COMPLETED)
        if desk.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            desk.result()  # raises what stopped it
        return running.result()
    finally:
        for task in (running, desk):
            task.cancel()
        for task in (running, desk):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def offer_ask_user(sandbox: Sandbox, proxy: LlmProxy) -> McpServerSpec:
    """Copy the MCP server into the sandbox's agent logs; the server to offer the agent.

    Raises:
        SandboxError: the file cannot be written.
    """
    path = f"{sandbox.layout.logs_dir}/agent/mcp/ask_user_server.py"
    await sandbox.put_file(path, SERVER_SOURCE.read_bytes())
    env = {"REROLL_ASK_URL": proxy.ask_url, "REROLL_ASK_TOKEN": proxy.token}
    return McpServerSpec(name=SERVER_NAME, transport="stdio", command="python3", args=[path], env=env)
