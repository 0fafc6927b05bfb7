"""ask_user in the controller: the MCP server's checks of a call (in process), and the `Answerer`:
recorded answers before a continuation's cut, a branch's answer at it, the User's after it, a
note when nobody can answer; asks.json records each with its step and place."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from reroll.rollout.turns import ask_user_server
from reroll.rollout.turns.asks import NO_ANSWER, Answerer
from reroll.runfolder.asks import AskRecord, load_asks
from reroll.trials.users import BaseUser
from reroll_contracts.asks import PendingAsk
from reroll_contracts.errors import RunFolderError, UserCallbackError
from reroll_contracts.trajectory import Place
from rich.console import Console


def call(ident: int, name: str, arguments: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": ident,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("Which language?", "ask_user takes an object {question: string, options?: [string]}"),
        ({}, "`question` must be a non-empty string"),
        ({"question": 3}, "`question` must be a non-empty string"),
        ({"question": "q", "options": "a,b"}, "`options` must be a list of non-empty strings"),
        ({"question": "q", "options": ["a", ""]}, "`options` must be a list of non-empty strings"),
        ({"question": "q", "choices": ["a"]}, "unknown argument(s) ['choices']"),
    ],
)
def test_a_malformed_call_gets_a_tool_error_saying_what_is_wrong(arguments: Any, message: str) -> None:
    response = ask_user_server.handle(call(7, "ask_user", arguments))
    assert response is not None and response["id"] == 7
    assert response["result"]["isError"] is True and message in response["result"]["content"][0]["text"]


def error_code(message: Any) -> int:
    """The JSON-RPC error code the server answers `message` with."""
    response = ask_user_server.handle(message)
    assert response is not None
    code: int = response["error"]["code"]
    return code


def test_protocol_errors() -> None:
    assert error_code(call(1, "rm_rf", {})) == -32602
    assert error_code({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}) == -32601
    assert ask_user_server.handle({"jsonrpc": "2.0", "method": "notifications/initialized"}) is None
    assert error_code([1, 2]) == -32600


PLACE = Place(turn=0, scene="main", role="agent")


def pending(number: int, step: int, options: list[str] | None = None) -> PendingAsk:
    return PendingAsk(
        id=number, question=f"q{number}?", options=options or [], step=step, place=PLACE, asked_at="t"
    )


class Picky(BaseUser):
    def answer(self, question: str, options: list[str]) -> str | None:
        return options[-1] if options else None


class Broken(BaseUser):
    def answer(self, question: str, options: list[str]) -> Any:
        return 42


async def test_answers_come_from_the_recording_then_the_branch_then_the_user(tmp_path: Path) -> None:
    recorded = [
        AskRecord(question="q0?", index=0, step=1, asked_at="t", answer="as recorded", answered_by="user")
    ]
    answerer = Answerer(tmp_path, recorded, branch_answer="the branch's")
    given = [
        await answerer.answer(pending(0, 1), Picky()),
        await answerer.answer(pending(1, 3, ["a", "b"]), Picky()),
        await answerer.answer(pending(2, 5, ["c", "d"]), Picky()),
        await answerer.answer(pending(3, 6), Picky()),
        await answerer.answer(pending(4, 7, ["e"]), None),
    ]
    assert [(a.index, a.step, a.answer, a.answered_by) for a in given] == [
        (0, 1, "as recorded", "recorded"),
        (1, 3, "the branch's", "branch"),
        (2, 5, "d", "user"),
        (3, 6, NO_ANSWER, "nobody"),
        (4, 7, NO_ANSWER, "nobody"),
    ]
    assert load_asks(tmp_path) == given and given[2].place == PLACE and given[2].options == ["c", "d"]


async def test_a_user_answering_a_non_string_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserCallbackError, match="the User's answer to 'q0\\?' returned int, not str or None"):
        await Answerer(tmp_path).answer(pending(0, 0), Broken())


def test_a_corrupt_asks_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "asks.json").write_text(json.dumps({"asks": [{"question": "q"}]}))
    with pytest.raises(RunFolderError, match=r"asks\.json: invalid"):
        load_asks(tmp_path)


class FakeProxy:
    """The two calls `Answerer.serve` makes, for one batch of questions."""

    def __init__(self, asks: list[PendingAsk]) -> None:
        self.asks, self.answered = asks, asyncio.Event()
        self.answers: dict[int, str] = {}

    async def next_asks(self) -> list[PendingAsk]:
        asks, self.asks = self.asks, []
        if not asks:
            await asyncio.sleep(3600)
        return asks

    async def answer_ask(self, ask: int, answer: str) -> bool:
        self.answers[ask] = answer
        self.answered.set()
        return True


async def test_the_agents_text_is_no_console_markup(tmp_path: Path) -> None:
    """Attack: a question made of rich markup (an unbalanced closing tag raises in rich) neither
    stops the answering nor styles the console."""
    hostile = PendingAsk(id=0, question="[/dim][bold red]x[/]", step=0, asked_at="t")
    proxy = FakeProxy([hostile])
    console = Console(file=io.StringIO(), width=200)
    desk = asyncio.ensure_future(Answerer(tmp_path).serve(proxy, Picky(), console))  # type: ignore[arg-type]
    await asyncio.wait_for(proxy.answered.wait(), 5)
    desk.cancel()
    assert proxy.answers == {0: NO_ANSWER}
    assert "'[/dim][bold red]x[/]'" in console.file.getvalue()  # type: ignore[attr-defined]
