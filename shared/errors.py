"""Typed protocol errors and the stable failure codes clients may switch on."""
from __future__ import annotations

# Failure.code values set by the fleet itself (the engine adds its own validation codes,
# such as ``prompt_too_long`` or ``invalid_temperature``).
MALFORMED = "malformed"  # not JSON, wrong types, missing or unknown fields
TOO_LARGE = "too_large"  # payload over MAX_PAYLOAD_BYTES
TOO_DEEP = "too_deep"  # JSON nested deeper than MAX_JSON_DEPTH
UNSUPPORTED_VERSION = "unsupported_version"
POISON = "poison"  # delivered too many times without finishing
INTERNAL = "internal"  # the engine failed on this request
TENANT_MISMATCH = "tenant_mismatch"  # the payload names a tenant other than its stream's
INVALID_GRAMMAR = "invalid_grammar"  # a structured-output spec that does not compile
ID_CONFLICT = "id_conflict"  # the request id is taken by a different request


class ProtocolError(ValueError):
    """A stream entry that cannot be served as sent. ``code`` goes on the wire.

    ``request_id``/``tenant`` are set when they could be read, so the client can still be
    told with a typed :class:`~shared.protocol.Failure`.
    """

    def __init__(self, code: str, message: str, *, request_id: str | None = None,
                 tenant: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.tenant = tenant
