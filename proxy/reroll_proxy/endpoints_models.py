"""The proxy's endpoints beside the model calls: token counting and the model list.

Agents such as Claude Code call them around their ``/v1/messages`` requests; neither is an
exchange of the trajectory (they answer no turn, and a replay needs no recording of them).

- ``POST /v1/messages/count_tokens`` (also without ``/v1``): forwarded to the live upstream when
  it speaks Anthropic Messages (its answer as it is). Otherwise (replay-only, or an upstream of
  another format) it is answered from the recording: the prompt tokens the model reported for a
  recorded ``/v1/messages`` request with the same messages, system prompt and tools (normalised,
  volatile parts removed — the count the provider itself gave for that prompt). With no such
  request, 501 ``count_tokens_unavailable``: never a guess, since a count that is too low makes
  an agent put off compacting its context past the model's limit.
- ``GET /v1/models`` and ``GET /v1/models/{id}`` (also without ``/v1``): the models this proxy
  serves — the live upstream's model (``upstream.model``) and the models of the recorded
  exchanges — in Anthropic's shape when the request carries ``anthropic-version``, else
  OpenAI's. Answered locally, never forwarded: the agent sees the model it will be served,
  not a provider's catalogue. An unknown id is a 404.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from reroll_contracts.proxy import UpstreamConfig
from reroll_contracts.trajectory import Exchange
from reroll_contracts.wire import format_for_path, format_named

from reroll_proxy.front import Handler, Router
from reroll_proxy.messages import Request, Response, StreamResponse, json_response
from reroll_proxy.respond import error_response
from reroll_proxy.upstream import Upstream, UpstreamError, UpstreamRequest
from reroll_proxy.volatile import Volatility

COUNT_TOKENS_PATHS = ("/v1/messages/count_tokens", "/messages/count_tokens")
"""Where Anthropic's SDK posts token counts."""
MODELS_PATHS = ("/v1/models", "/models")
"""The model list (``/{id}`` below each: one model)."""
_MESSAGES = format_named("anthropic-messages")
_CREATED = "2025-01-01T00:00:00Z"
"""The ``created_at`` every listed model carries (Anthropic's shape asks for one)."""


class ModelEndpoints:
    """The handlers of the endpoints above, for one proxy.

    Args:
        upstream: the live upstream, or None (replay-only).
        recorded: the recorded exchanges (may be empty).
        volatility: the declared volatile parts, removed before prompts are compared.
        upstream_client: returns the proxy's `Upstream` (None without one); called when a
            request arrives, so the upstream may be set after this object.
    """

    def __init__(
        self,
        upstream: UpstreamConfig | None,
        recorded: Sequence[Exchange],
        volatility: Volatility,
        upstream_client: Callable[[], Upstream | None],
    ) -> None:
        self.upstream = upstream
        self.recorded = recorded
        self.volatility = volatility
        self.upstream_client = upstream_client

    def add_routes(self, routes: Router[Handler]) -> None:
        """Route the endpoints on `routes`."""
        for path in COUNT_TOKENS_PATHS:
            routes.add("POST", path, self.count_tokens)
        for path in MODELS_PATHS:
            routes.add("GET", path, self.list_models)
            routes.add("GET", path + "/{model_id}", self.get_model)

    async def count_tokens(self, request: Request) -> StreamResponse:
        """``POST …/messages/count_tokens`` (see the module docstring)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return error_response(_MESSAGES, 400, "invalid_request_error", f"request body is not JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            message = "count_tokens needs a 'messages' list"
            return error_response(_MESSAGES, 400, "invalid_request_error", message)
        client = self.upstream_client()
        if self.upstream is not None and self.upstream.api_format in (None, _MESSAGES.name) and client:
            return await self._forward(request, body, client)
        tokens = self.recorded_count(body)
        if tokens is None:
            message = (
                "count_tokens: no live Anthropic upstream to ask, and no recorded /v1/messages request "
                "has this prompt (reroll never guesses a count: one too low breaks context compaction)"
            )
            return error_response(_MESSAGES, 501, "count_tokens_unavailable", message)
        return json_response({"input_tokens": tokens})

    def recorded_count(self, body: dict[str, Any]) -> int | None:
        """The prompt tokens reported for a recorded Messages request with `body`'s prompt, or None.

        Args:
            body: a count_tokens body (``messages``, optional ``system`` and ``tools``).

        Returns:
            The recorded ``input_tokens`` plus cache reads and writes, or None when no recorded
            request has the same normalised messages and tools, or its response says no count.
        """
        wanted = self._prompt(body)
        for exchange in self.recorded:
            wire = format_for_path(exchange.request.path)
            sent = exchange.request.body
            if wire is not _MESSAGES or not isinstance(sent, dict) or self._prompt(sent) != wanted:
                continue
            answered = exchange.response.body
            if exchange.response.status_code < 400 and isinstance(answered, dict):
                usage = _MESSAGES.normalise_response(answered)["usage"]
                if usage is not None and usage["prompt_tokens"] is not None:
                    return usage["prompt_tokens"]
        return None

    def _prompt(self, body: dict[str, Any]) -> tuple[bytes, bytes]:
        prompt = {key: body[key] for key in ("messages", "system", "tools") if key in body}
        normal = _MESSAGES.normalise(self.volatility.apply(prompt))
        return orjson.dumps(normal["messages"]), orjson.dumps(normal["tools"])

    async def _forward(self, request: Request, body: dict[str, Any], client: Upstream) -> StreamResponse:
        assert self.upstream is not None
        sent = {**body, "model": self.upstream.model} if self.upstream.model else body
        url = self.upstream.base_url.rstrip("/") + "/messages/count_tokens"
        if request.query_string:
            url += "?" + request.query_string
        headers = _MESSAGES.upstream_headers(self.upstream.api_key, request.headers)
        sending = UpstreamRequest(url, headers | {"Content-Type": "application/json"}, orjson.dumps(sent))
        try:
            async with await client.send(sending) as response:
                payload = await response.read()
                content_type = response.content_type or "application/json"
                return Response(status=response.status, body=payload, content_type=content_type)
        except UpstreamError as exc:
            return error_response(_MESSAGES, 502, "upstream_error", f"upstream {url} unreachable: {exc}")

    def model_ids(self) -> list[str]:
        """The models served: the upstream's, then those of the recorded exchanges, each once."""
        names = [self.upstream.model] if self.upstream is not None and self.upstream.model else []
        names += [exchange.metadata.model or "" for exchange in self.recorded]
        return [name for name in dict.fromkeys(names) if name]

    async def list_models(self, request: Request) -> Response:
        """``GET …/models``: every served model (see the module docstring)."""
        anthropic = "anthropic-version" in request.headers
        items = [_model_item(name, anthropic=anthropic) for name in self.model_ids()]
        if anthropic:
            first, last = (items[0]["id"], items[-1]["id"]) if items else (None, None)
            return json_response({"data": items, "has_more": False, "first_id": first, "last_id": last})
        return json_response({"object": "list", "data": items})

    async def get_model(self, request: Request) -> Response:
        """``GET …/models/{id}``: one served model, or 404."""
        anthropic = "anthropic-version" in request.headers
        wanted = request.match_info["model_id"]
        if wanted not in self.model_ids():
            wire = _MESSAGES if anthropic else format_named("openai-chat")
            return error_response(wire, 404, "not_found_error", f"model {wanted!r} is not served here")
        return json_response(_model_item(wanted, anthropic=anthropic))


def _model_item(name: str, *, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "model", "id": name, "display_name": name, "created_at": _CREATED}
    return {"id": name, "object": "model", "created": 0, "owned_by": "reroll"}
