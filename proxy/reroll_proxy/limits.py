"""What the proxy grants one client connection: time to send its headers and its body, and size.

Everything an agent sends is hostile input. Without these limits a client that sends half a
request keeps a connection (and its memory) forever. The server (`reroll_proxy.front`) closes a
connection that has not sent a complete request head within
`ClientLimits.header_timeout_seconds` of opening or of its last response, answers `timeout_refusal`
(408) to a body that has not arrived within `ClientLimits.body_timeout_seconds` of its head, and
`size_refusal` (413) to one over `ClientLimits.max_request_bytes` (and 431 to a request head over
`reroll_proxy.front.MAX_HEAD_BYTES`); after a refusal it closes the connection the lingering way
(`LINGER_SECONDS`). Responses (a stream may rightly last minutes)
have no limit here: the upstream's own timeout and the agent's budget bound them.
"""

from __future__ import annotations

from reroll_contracts.proxy import ClientLimits

from reroll_proxy.messages import Response, json_response

LINGER_SECONDS = 1.0
"""After a refusal sent before its request's body was read (a 408, a 413), how long what the
client still sends is read and dropped before the connection is closed (closing with unread
bytes would send a RST, which can discard the response before the client reads it)."""


def timeout_refusal(limits: ClientLimits) -> Response:
    """The 408 for a body that did not arrive within ``limits.body_timeout_seconds``."""
    message = f"the request body did not arrive within {limits.body_timeout_seconds:g} s"
    return _refusal(408, "request_timeout", message)


def size_refusal(limits: ClientLimits) -> Response:
    """The 413 for a body over ``limits.max_request_bytes``."""
    return _refusal(413, "request_too_large", f"the request body exceeds {limits.max_request_bytes} bytes")


def _refusal(status: int, kind: str, message: str) -> Response:
    response = json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)
    response.force_close()
    return response
