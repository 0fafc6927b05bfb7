"""`reroll.runfolder.conversation`: incremental normalisation equals the format's own."""

from __future__ import annotations

from typing import Any

import pytest
from reroll.runfolder.conversation import _Normaliser
from reroll_contracts.wire import format_named

from tests.export.conftest import in_format


@pytest.mark.parametrize("name", ["openai-chat", "openai-responses", "anthropic-messages"])
def test_reusing_the_previous_request_gives_what_normalise_gives(name: str) -> None:
    wire = format_named(name)
    requests: list[dict[str, Any]] = [request for request, _ in in_format(name)]
    side = {**requests[0], wire.conversation_key: requests[0][wire.conversation_key][-1:]}
    changed = dict(requests[-1])
    if name == "openai-chat":
        changed["messages"] = [{"role": "system", "content": "Another prompt."}, *changed["messages"][1:]]
    else:
        changed["instructions" if name == "openai-responses" else "system"] = "Another prompt."
    normaliser = _Normaliser()
    for body in [requests[0], requests[1], side, requests[2], changed, requests[2]]:
        assert normaliser.messages(wire, body) == wire.normalise(body)["messages"]
