"""Thread assignment: continuation, retries, forks, formats, numbering in order of first appearance."""

from __future__ import annotations

from typing import Any

from reroll_contracts.wire import format_named
from reroll_proxy.threads import EXTENDS, RETRY, ThreadBook, Turn, assign_threads, continuation_rank


def turn(*messages: tuple[str, str], api_format: str = "openai-chat") -> Turn:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}
    if api_format == "openai-responses":
        body = {"model": "m", "input": body["messages"]}
    return Turn(api_format, format_named(api_format).normalise(body))


START = turn(("system", "Agent."), ("user", "Fix it."))
NEXT = turn(("system", "Agent."), ("user", "Fix it."), ("assistant", "ls"), ("tool", "a.py"))
FORK = turn(("system", "Agent."), ("user", "Fix it."), ("user", "Summarise."))


def test_a_request_extending_the_previous_one_with_its_answer_continues_it() -> None:
    assert continuation_rank(START, NEXT) == EXTENDS
    assert continuation_rank(NEXT, NEXT) == RETRY
    assert continuation_rank(NEXT, START) is None
    assert continuation_rank(START, FORK) is None  # a side call on the same conversation


def test_another_format_is_another_thread() -> None:
    responses = turn(
        ("system", "Agent."), ("user", "Fix it."), ("assistant", "ls"), api_format="openai-responses"
    )
    assert continuation_rank(START, responses) is None


def test_threads_are_numbered_in_order_of_first_appearance() -> None:
    sub = turn(("system", "Subagent."), ("user", "Read a.py."))
    assert assign_threads([START, sub, None, NEXT, FORK, NEXT]) == [0, 1, 2, 0, 3, 0]


def test_of_two_threads_at_the_same_point_the_lower_number_continues() -> None:
    book = ThreadBook()
    assert [book.assign(START), book.open()] == [0, 1]
    book.lasts[1] = START
    assert book.find(NEXT) == 0


def test_an_extension_is_preferred_to_a_retry() -> None:
    book = ThreadBook([NEXT, START])
    assert book.find(NEXT) == 1  # thread 1 continued, rather than thread 0 retried
    longer = turn(
        ("system", "Agent."),
        ("user", "Fix it."),
        ("assistant", "ls"),
        ("tool", "a.py"),
        ("assistant", "cat a.py"),
    )
    assert book.find(longer) == 0  # both continued: the longer previous request wins


def test_the_root_is_the_system_prompt_tools_and_first_user_turn() -> None:
    assert NEXT.root() == START.root() == ("openai-chat", [], START.messages)
