"""`OutputTail`: what exec keeps of a stream its caller takes chunk by chunk."""

from __future__ import annotations

from reroll.sandbox.results import OutputTail


def test_the_tail_keeps_the_last_bytes_across_chunks() -> None:
    tail = OutputTail(5)
    for chunk in (b"abc", b"", b"defg", b"h"):
        tail.add(chunk)
    assert tail.value() == b"defgh"
    tail.add(b"0123456789")  # one chunk longer than the limit
    assert tail.value() == b"56789"


def test_without_a_limit_everything_is_kept() -> None:
    tail = OutputTail(None)
    for chunk in (b"abc", b"def"):
        tail.add(chunk)
    assert tail.value() == b"abcdef"
