"""Responses over WebSocket (``GET /v1/responses`` with ``Upgrade: websocket``): refused at once.

OpenAI's Responses API can also be spoken over a WebSocket (the client sends
``response.create`` messages, the server the stream's events as text frames); Codex CLI tries it
first when its provider supports it (its built-in OpenAI provider does). The proxy records and
replays HTTP exchanges only, so it refuses the upgrade with **426 Upgrade Required**: Codex takes
that status as "this server speaks HTTP only" and falls back to ``POST /v1/responses`` on the
spot, for the rest of its session. Any other refusal (404, 405, a dropped connection) counts as
a transient failure there: Codex retried the upgrade 7 times over about 7.5 s before falling back
(codex-cli 0.147.0, measured against a server answering 404).

The refusal carries an error body in the Responses shape and is not an exchange (nothing reaches
a model, nothing is recorded); `WebsocketRefusals` counts them for ``GET /_reroll/status``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from reroll_contracts.wire import format_named

from reroll_proxy.messages import Request, Response

log = logging.getLogger("reroll_proxy")
REFUSAL_STATUS = 426
"""Upgrade Required: the status Codex takes as "fall back to HTTP now"."""
PATHS = ("/v1/responses", "/responses")
"""Where a Responses WebSocket is opened (``GET``, the paths of ``POST`` Responses requests)."""


@dataclass
class WebsocketRefusals:
    """Answers ``GET`` on the Responses paths with a 426 and counts the upgrades refused."""

    count: int = 0
    """WebSocket upgrades refused so far."""

    async def refuse(self, request: Request) -> Response:
        """The 426 answer to `request` (a WebSocket upgrade, or a plain ``GET``).

        Returns:
            A 426 response with an ``error`` body of the Responses format and
            ``Connection: close``; an upgrade is counted in `count`.
        """
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if upgrade:
            self.count += 1
            log.info("refused a Responses WebSocket upgrade (%d so far): HTTP only", self.count)
        message = (
            "the reroll proxy serves the Responses API over HTTP only (POST /v1/responses); "
            "WebSocket upgrades are refused so the client falls back at once"
        )
        body = format_named("openai-responses").error_body("websocket_not_supported", message)
        return Response(
            status=REFUSAL_STATUS,
            body=body,
            content_type="application/json",
            headers={"Connection": "close"},
        )
