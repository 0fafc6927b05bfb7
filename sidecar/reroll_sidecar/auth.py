"""The bearer-token check every RPC of the sidecar passes: a gRPC server interceptor."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

log = logging.getLogger(__name__)

_HANDLER_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


async def _reject(_request: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or wrong token: send the metadata 'authorization: Bearer <token>'",
    )


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets through only RPCs whose metadata carries ``authorization: Bearer <token>``.

    Any other RPC fails with UNAUTHENTICATED before it reaches the service.

    Args:
        token: the secret the controller started the sidecar with; must not be empty.
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the sidecar's token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def _authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                sent = value if isinstance(value, bytes) else value.encode()
                return hmac.compare_digest(sent, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        """Hand the RPC on to the service, or to a handler of the same kind that rejects it."""
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details.invocation_metadata):
            return handler
        log.warning("rejected %s: missing or wrong token", handler_call_details.method)
        factory = _HANDLER_FACTORIES[(handler.request_streaming, handler.response_streaming)]
        return factory(_reject, handler.request_deserializer, handler.response_serializer)
