"""The run folder's agent log (`reroll.runfolder.agent_log`): capped, with a note line when cut."""

from __future__ import annotations

from pathlib import Path

from reroll.runfolder.agent_log import AGENT_LOG, CUT_NOTE, AgentLog


def test_output_under_the_cap_is_kept_whole_without_a_note(tmp_path: Path) -> None:
    with AgentLog(tmp_path / AGENT_LOG, limit=10) as log:
        log.write(b"12345")
        log.write(b"67890")
    assert (tmp_path / AGENT_LOG).read_bytes() == b"1234567890" and log.dropped == 0


def test_output_over_the_cap_is_cut_with_a_note_and_later_turns_add_only_notes(tmp_path: Path) -> None:
    path = tmp_path / AGENT_LOG
    with AgentLog(path, limit=10) as log:
        for _ in range(3):
            log.write(b"abcd")
    assert log.dropped == 2
    first, note, end = path.read_bytes().split(b"\n")
    assert first == b"abcdabcdab" and end == b""
    assert (
        note.decode()
        == f"{CUT_NOTE} {AGENT_LOG} keeps the first 10 bytes; 2 more bytes of this turn were dropped"
    )
    with AgentLog(path, limit=10) as second_turn:  # a later turn appends to the same, full, log
        second_turn.write(b"zzzz")
    assert path.read_bytes().count(CUT_NOTE.encode()) == 2 and b"zzzz" not in path.read_bytes()
