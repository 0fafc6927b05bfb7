"""The agent phase's pure parts: what a failed agent said last."""

from __future__ import annotations

from reroll.rollout.agent_phase import output_tail


def test_output_tail_keeps_the_last_non_empty_lines() -> None:
    assert output_tail("one\n\ntwo\nthree\n  four  \n\n") == "two | three | four"
    assert output_tail("x" * 1000).startswith("…") and len(output_tail("x" * 1000)) == 401
