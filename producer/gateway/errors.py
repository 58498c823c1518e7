"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with a status.

Every refusal the gateway makes is a :class:`GatewayError`; the app turns it into the JSON
body (or, once a stream has started, into a final SSE ``error`` event). Routing errors,
Redis failures and unexpected exceptions are mapped to one as well
(:mod:`producer.gateway.handlers`), so no answer is ever anything but this shape.
"""
from __future__ import annotations

import re

import msgspec

from shared import errors as fleet_errors
from shared.protocol import Failure

# Fleet failure codes that are the server's fault, not the request's.
_SERVER_CODES = {fleet_errors.POISON, fleet_errors.INTERNAL}
_CONTEXT_CODES = {"prompt_too_long", "exceeds_kv_cache"}
_PATH_RE = re.compile(r"at `\$\.?([^`]*)`")


class GatewayError(Exception):
    """A refusal with an HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def from_validation(exc: msgspec.MsgspecError) -> GatewayError:
    """A msgspec decode/validation error as a 400 naming the offending field."""
    text = str(exc)
    match = _PATH_RE.search(text)
    param = match.group(1) if match else None
    if isinstance(exc, msgspec.DecodeError) and "JSON" in text and param is None:
        return invalid(f"the body is not valid JSON: {text}", code="invalid_json")
    if text.startswith("Object missing required field"):
        field = text.split("`")[1] if "`" in text else None
        prefix = f"{param}." if param else ""
        return invalid(f"'{prefix}{field}' is a required property", param=f"{prefix}{field}",
                       code="missing_required_parameter")
    return invalid(f"invalid request: {text}", param=param, code="invalid_value")


def from_failure(failure: Failure) -> GatewayError:
    """The fleet's typed failure as an HTTP error: a bad request, or the server's fault."""
    if failure.code in _SERVER_CODES:
        return GatewayError(500, failure.message, type="server_error", code=failure.code)
    if failure.retryable:
        return _retry_later(failure.message, failure.code, 1)
    code = "context_length_exceeded" if failure.code in _CONTEXT_CODES else failure.code
    return GatewayError(400, failure.message, code=code)


def _retry_later(message: str, code: str, retry_after_s: int) -> GatewayError:
    return GatewayError(503, message, type="server_error", code=code,
                        headers={"Retry-After": str(retry_after_s)})


def overloaded(message: str, retry_after_s: int) -> GatewayError:
    return _retry_later(message, "overloaded", retry_after_s)


def rate_limited(message: str, retry_after_s: int) -> GatewayError:
    return GatewayError(429, message, type="rate_limit_exceeded", code="rate_limit_exceeded",
                        headers={"Retry-After": str(retry_after_s)})


def too_large(message: str) -> GatewayError:
    return GatewayError(413, message, code="request_too_large")


def unavailable(retry_after_s: int) -> GatewayError:
    """Redis (the fleet's queue) cannot take or answer the call now; a retry may succeed."""
    return _retry_later("the fleet's queue is unavailable; retry later", "queue_unavailable",
                        retry_after_s)


def internal() -> GatewayError:
    # Says nothing about the cause: details (and any secret in them) stay in the log.
    return GatewayError(500, "internal error in the gateway", type="server_error",
                        code="internal_error")


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def from_http(status: int, headers: dict[str, str] | None = None) -> GatewayError:
    """A routing refusal (unknown path, wrong method) in the OpenAI shape."""
    message = {404: "no such endpoint; the API lives under /v1",
               405: "method not allowed on this endpoint"}.get(status, f"HTTP error {status}")
    return GatewayError(status, message, code=_HTTP_CODES.get(status, f"http_{status}"),
                        headers=headers)
