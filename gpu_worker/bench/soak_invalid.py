"""The soak's hostile traffic: raw stream entries no client library would send.

Each kind builds the fields of one entry and says which failure codes its client may get:
an empty set means no request id can be read from it, so it is only dead-lettered.
"""
from __future__ import annotations

import json
import random

from shared import limits as L

_DEPTH = 100_000  # far past any sane nesting limit, still well under the payload limit


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


def _random_bytes(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": rng.randbytes(rng.randint(1, 2048))}


def _no_data_field(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"payload": _json({"request_id": request_id, "prompt": "hi"})}


def _not_an_object(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json([request_id, "hi", 4])}


def _bad_id(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": "{bad} " + request_id, "prompt": "hi"})}


def _deep_anonymous(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": b"[" * _DEPTH + b"]" * _DEPTH}


def _wrong_types(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": request_id, "prompt_token_ids": "not a list",
                           "max_tokens": "many", "temperature": [0]})}


def _missing_prompt(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": request_id, "max_tokens": 4})}


def _unknown_field(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": request_id, "prompt": "hi", "reply_to": "elsewhere"})}


def _wrong_version(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"v": rng.choice([0, 2, 99]), "request_id": request_id, "prompt": "hi"})}


def _deep_nesting(rng: random.Random, request_id: str) -> dict[str, bytes]:
    head = _json({"request_id": request_id, "prompt": "hi"})[:-1]
    return {"data": head + b', "metadata": ' + b"[" * _DEPTH + b"]" * _DEPTH + b"}"}


def _oversized(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": request_id, "prompt": "x" * (L.MAX_PAYLOAD_BYTES + 1)})}


def _bad_token_id(rng: random.Random, request_id: str) -> dict[str, bytes]:
    return {"data": _json({"request_id": request_id, "prompt_token_ids": [1, L.MAX_TOKEN_ID],
                           "max_tokens": 4})}


# kind -> (builder, failure codes the client may get; empty: unaddressable)
KINDS = {
    "random_bytes": (_random_bytes, frozenset()),
    "no_data_field": (_no_data_field, frozenset()),
    "not_an_object": (_not_an_object, frozenset()),
    "bad_id": (_bad_id, frozenset()),
    "deep_anonymous": (_deep_anonymous, frozenset()),
    "wrong_types": (_wrong_types, frozenset({"malformed"})),
    "missing_prompt": (_missing_prompt, frozenset({"malformed"})),
    "unknown_field": (_unknown_field, frozenset({"malformed"})),
    "wrong_version": (_wrong_version, frozenset({"unsupported_version"})),
    "deep_nesting": (_deep_nesting, frozenset({"malformed", "too_deep"})),
    "oversized": (_oversized, frozenset({"too_large"})),
    "bad_token_id": (_bad_token_id, frozenset({"invalid_token_id"})),
}


def invalid_entry(kind: str, rng: random.Random, request_id: str) -> tuple[dict[str, bytes], frozenset]:
    """The fields of one ``kind`` entry for ``request_id``, and the codes its client may get."""
    build, codes = KINDS[kind]
    return build(rng, request_id), codes
