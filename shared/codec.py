"""The one encoder and the decoders of the protocol, built once and reused."""
from __future__ import annotations

import msgspec

from shared import errors, limits as L
from shared.protocol import Cancel, Event, Request, Terminal, Token
from shared.scan import scan

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(Request)
_event_decoder = msgspec.json.Decoder(Event)
_terminal_decoder = msgspec.json.Decoder(Terminal)
_token_decoder = msgspec.json.Decoder(Token)
_cancel_decoder = msgspec.json.Decoder(Cancel)


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode_request(raw: object) -> Request:
    """Decode and bound-check one stream entry's payload.

    Raises :class:`~shared.errors.ProtocolError` with code ``too_large``, ``too_deep``,
    ``unsupported_version`` or ``malformed`` (never anything else, whatever ``raw`` holds),
    carrying the request id and tenant wherever a bounded scan can read them.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, (bytes, bytearray)):
        raise errors.ProtocolError(errors.MALFORMED, f"payload must be bytes, got {type(raw).__name__}")
    if len(raw) > L.MAX_PAYLOAD_BYTES:
        raise _failed(raw, errors.TOO_LARGE,
                      f"payload is {len(raw)} bytes; the limit is {L.MAX_PAYLOAD_BYTES}")
    # No field of Request is untyped or recursive but a structured output's JSON Schema, so
    # the typed decode fails at the first level its schema does not have: nesting is bounded
    # before any deep recursion, and the (slower, Python-level) depth scan runs on failures
    # only, and on requests carrying a JSON Schema (untyped). A test keeps it that way.
    try:
        request = _request_decoder.decode(raw)
        if request.structured is None or not scan(raw).too_deep:
            return request
        message = "too deep"
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        message = str(exc)
    except RecursionError:  # msgspec recursed: the scan below says how deep it went
        message = "nested too deeply"
    except Exception as exc:  # noqa: BLE001 - hostile input must never escape as anything else
        message = f"undecodable ({type(exc).__name__})"
    raise _failed(raw, errors.MALFORMED, message)


def _failed(raw: bytes, code: str, message: str) -> errors.ProtocolError:
    found = scan(raw)
    if found.too_deep:
        code, message = errors.TOO_DEEP, f"JSON nested deeper than {L.MAX_JSON_DEPTH} levels"
    elif code == errors.MALFORMED and found.version not in (None, L.PROTOCOL_VERSION):
        code = errors.UNSUPPORTED_VERSION
    return errors.ProtocolError(code, message, request_id=found.request_id, tenant=found.tenant)


def decode_event(raw: bytes | str) -> Event:
    return _event_decoder.decode(raw)


def decode_terminal(raw: bytes | str) -> Terminal:
    return _terminal_decoder.decode(raw)


def decode_token(raw: bytes | str) -> Token:
    return _token_decoder.decode(raw)


def decode_cancel(raw: bytes | str) -> Cancel:
    return _cancel_decoder.decode(raw)
