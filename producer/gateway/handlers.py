"""How every failure becomes an OpenAI-shaped JSON answer.

Refusals (:class:`GatewayError`), routing errors (404, 405), Redis failures (503 with
``Retry-After``) and a client gone mid-call each have a handler; :class:`Guard` catches
whatever else escapes, answers 500 without details and logs it once, redacted.
"""
from __future__ import annotations

import logging
import traceback

from redis.exceptions import RedisClusterException, RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.gateway.errors import GatewayError, from_http, internal, unavailable
from producer.gateway.redact import redact
from producer.gateway.serve import ClientGone

logger = logging.getLogger(__name__)


def error_response(error: GatewayError) -> Response:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _gateway_error(request: HttpRequest, exc: GatewayError) -> Response:
    return error_response(exc)


async def _http_error(request: HttpRequest, exc: HTTPException) -> Response:
    return error_response(from_http(exc.status_code, exc.headers))


async def _client_gone(request: HttpRequest, exc: Exception) -> Response:
    # Nobody reads it (the request was cancelled), but it keeps the one shape.
    return error_response(GatewayError(499, "the client closed the request",
                                       code="client_closed_request"))


async def _redis_failed(request: HttpRequest, exc: Exception) -> Response:
    # Refused connections, timeouts, LOADING, OOM, NOPERM, READONLY, a cluster whose slots
    # are not (yet) covered...: the queue cannot take the call now. Operators need the cause; the client needs only "retry later".
    logger.warning("redis unavailable: %s: %s", type(exc).__name__, redact(str(exc)))
    return error_response(unavailable(request.app.state.gateway.options.retry_after_s))


EXCEPTION_HANDLERS = {GatewayError: _gateway_error, HTTPException: _http_error,
                      ClientGone: _client_gone, ClientDisconnect: _client_gone,
                      RedisError: _redis_failed, RedisClusterException: _redis_failed}


class Guard:
    """Outermost ASGI middleware: an exception no handler took becomes a 500 JSON error
    (when no header has been sent yet) and one redacted log line with its traceback. It is
    never re-raised, so the server prints no traceback of its own, secrets included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:  # noqa: BLE001 -- the last line of defence, by design
            logger.error("unexpected error in %s %s:\n%s", scope.get("method"), scope.get("path"),
                         redact(traceback.format_exc()))
            if not started:
                await error_response(internal())(scope, receive, send)
