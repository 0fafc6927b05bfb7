"""What the proxy grants one client connection: time to send its headers and its body, and size.

Everything an agent sends is hostile input. Without these limits a client that sends half a
request keeps a connection (and its memory) forever: aiohttp closes a connection that has not
sent a complete request head within ``keepalive_timeout`` (`ClientLimits.header_timeout_seconds`,
given to the runner by `runner_options`), but waits without limit for a body announced and never
sent — `read_body_in_time` puts a limit on that. Responses (a stream may rightly last minutes)
have no limit here: the upstream's own timeout and the agent's budget bound them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from reroll_contracts.proxy import ClientLimits

LINGER_SECONDS = 1.0
"""After a response sent before its request's body was read (a 401, a 408), how long aiohttp
still reads (and drops) the rest before it closes (its default: 10 s)."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def runner_options(limits: ClientLimits) -> dict[str, Any]:
    """The `aiohttp.web.AppRunner` keyword arguments that enforce `limits`' header timeout."""
    return {"keepalive_timeout": limits.header_timeout_seconds, "lingering_time": LINGER_SECONDS}


def read_body_in_time(limits: ClientLimits) -> Middleware:
    """A middleware that reads the request's body (aiohttp keeps it for the handler) within
    `ClientLimits.body_timeout_seconds`, else answers 408 and closes the connection (after
    `LINGER_SECONDS`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.content.is_eof():  # the whole body came with the head: nothing to wait for
                await request.read()
            else:
                async with asyncio.timeout(limits.body_timeout_seconds):
                    await request.read()
        except TimeoutError:
            message = f"the request body did not arrive within {limits.body_timeout_seconds:g} s"
            error = {"type": "error", "error": {"type": "request_timeout", "message": message}}
            response = web.json_response(error, status=408)
            response.force_close()
            return response
        return await handler(request)

    return middleware
