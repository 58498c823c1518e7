"""The one encoder and the decoders of the protocol, built once and reused."""
from __future__ import annotations

import re
from typing import Any

import msgspec

from shared import errors, limits as L
from shared.protocol import Cancel, Event, Request, Terminal, Token

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(Request)
_event_decoder = msgspec.json.Decoder(Event)
_terminal_decoder = msgspec.json.Decoder(Terminal)
_token_decoder = msgspec.json.Decoder(Token)
_cancel_decoder = msgspec.json.Decoder(Cancel)
_ID_RE = re.compile(L.REQUEST_ID_PATTERN)
_TENANT_RE = re.compile(L.TENANT_PATTERN)


class _Peek(msgspec.Struct):
    """Lenient view of a payload, to classify a failure and address the client."""

    v: Any = L.PROTOCOL_VERSION
    request_id: Any = None
    tenant: Any = "default"


_peek_decoder = msgspec.json.Decoder(_Peek)


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode_request(raw: bytes | str) -> Request:
    """Decode and bound-check one stream entry's payload.

    Raises :class:`~shared.errors.ProtocolError` with code ``too_large``,
    ``unsupported_version`` or ``malformed``; never anything else.
    """
    if isinstance(raw, str):
        raw = raw.encode()
    if len(raw) > L.MAX_PAYLOAD_BYTES:
        raise errors.ProtocolError(errors.TOO_LARGE,
                                   f"payload is {len(raw)} bytes; the limit is {L.MAX_PAYLOAD_BYTES}")
    try:
        return _request_decoder.decode(raw)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        request_id, tenant, version = _peek(raw)
        code = errors.MALFORMED
        if isinstance(version, int) and version != L.PROTOCOL_VERSION:
            code = errors.UNSUPPORTED_VERSION
        raise errors.ProtocolError(code, str(exc), request_id=request_id, tenant=tenant) from None


def _peek(raw: bytes) -> tuple[str | None, str | None, Any]:
    try:
        peek = _peek_decoder.decode(raw)
    except (msgspec.DecodeError, ValueError, TypeError):
        return None, None, None
    request_id = peek.request_id if isinstance(peek.request_id, str) else None
    tenant = peek.tenant if isinstance(peek.tenant, str) else None
    if request_id is None or not _ID_RE.match(request_id) or tenant is None \
            or not _TENANT_RE.match(tenant):
        return None, None, peek.v
    return request_id, tenant, peek.v


def decode_event(raw: bytes | str) -> Event:
    return _event_decoder.decode(raw)


def decode_terminal(raw: bytes | str) -> Terminal:
    return _terminal_decoder.decode(raw)


def decode_token(raw: bytes | str) -> Token:
    return _token_decoder.decode(raw)


def decode_cancel(raw: bytes | str) -> Cancel:
    return _cancel_decoder.decode(raw)
