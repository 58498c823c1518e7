"""JSON Schema of the protocol. ``python -m shared.schema > docs/protocol.schema.json``.

Generated from the structs of :mod:`shared.protocol` (and the tenant registry entry of
:mod:`shared.tenants`), then made exact where msgspec's export says less than the decoder
or the worker does:

- ``Request`` takes exactly one prompt form (``oneOf``: ``prompt``, ``messages`` or
  ``prompt_token_ids`` present and not null), and ``v`` is the one version workers speak.
- Every integer is bounded within what an IEEE-754 double holds exactly (2**53 - 1), so a
  JavaScript client (or any JSON parser that reads numbers as doubles) never rounds one:
  a bound the struct leaves open or sets beyond that (``seed`` goes to 2**63 - 1 in the
  struct) is this protocol's bound, 2**53 - 1.
- Outbound integers carry the ranges workers produce (token ids, ``seq``, counts).
- Events are a ``oneOf`` told apart by their ``type`` tags, without msgspec's OpenAPI
  ``discriminator`` (not a JSON Schema keyword: Ajv in strict mode refuses it).
- A registry entry's ``lanes`` do not repeat (``uniqueItems``).

What no JSON Schema can say is in the descriptions and in ``docs/protocol.md``:
``min_tokens <= max_tokens``, integers written without a fraction or exponent (a schema
takes ``16.0`` as an integer, the worker does not), no repeated keys, the payload size.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from shared import limits as L
from shared.protocol import Cancel, Event, Request
from shared.tenants import TenantConfig

MAX_SAFE_INTEGER = 2**53 - 1  # the largest n such that every integer in [-n, n] is a double

_PROMPT_FORMS = (("prompt", "string"), ("messages", "array"), ("prompt_token_ids", "array"))

_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": L.MAX_TOKEN_ID}
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_SAFE_INTEGER}

_STOP_REASON = {
    "anyOf": [{"type": "string"}, _TOKEN_ID, {"type": "null"}], "default": None,
    "description": "The stop string matched, or the stop token id (EOS or one of "
                   "`stop_token_ids`); null when the request did not stop on one."}

# (definition, property) -> the schema workers' output is guaranteed to satisfy.
_OUTBOUND: dict[tuple[str, str], dict[str, Any]] = {
    ("Token", "seq"): {"type": "integer", "minimum": 0, "maximum": L.MAX_TOKENS - 1,
                       "description": "Index of the first of `token_ids` in the output. A "
                                      "client accepts an event only when `seq` equals the "
                                      "number of tokens it has received so far."},
    ("Token", "token_ids"): {"type": "array", "minItems": 1, "maxItems": L.MAX_TOKENS,
                             "items": _TOKEN_ID},
    ("Result", "token_ids"): {"type": "array", "maxItems": L.MAX_TOKENS, "items": _TOKEN_ID},
    ("Result", "num_resumes"): {**_COUNT, "default": 0},
    ("Result", "stop_reason"): _STOP_REASON,
    ("Choice", "stop_reason"): _STOP_REASON,
    ("Choice", "token_ids"): {"type": "array", "maxItems": L.MAX_TOKENS, "items": _TOKEN_ID},
    ("Usage", "prompt_tokens"): _COUNT,
    ("Usage", "completion_tokens"): {**_COUNT, "maximum": L.MAX_TOKENS * L.MAX_N},
    ("Usage", "cached_tokens"): {**_COUNT, "default": 0},
    ("TokenLogprob", "token_id"): _TOKEN_ID,
    ("TokenLogprob", "top"): {"type": "array", "default": [], "maxItems": L.MAX_LOGPROBS,
                              "items": {"type": "array", "minItems": 2, "maxItems": 2,
                                        "items": False,
                                        "prefixItems": [_TOKEN_ID, {"type": "number"}]}},
}


def _bound_integers(node: Any) -> None:
    """Clamp every integer schema below into [-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER]."""
    if isinstance(node, list):
        for item in node:
            _bound_integers(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        node["minimum"] = max(node.get("minimum", -MAX_SAFE_INTEGER), -MAX_SAFE_INTEGER)
        node["maximum"] = min(node.get("maximum", MAX_SAFE_INTEGER), MAX_SAFE_INTEGER)
    for value in node.values():
        _bound_integers(value)


def _exact_request(request: dict[str, Any]) -> None:
    request["oneOf"] = [{"required": [name], "properties": {name: {"type": kind}}}
                        for name, kind in _PROMPT_FORMS]
    props = request["properties"]
    props["v"] = {"const": L.PROTOCOL_VERSION, "default": L.PROTOCOL_VERSION,
                  "description": "Protocol version; a worker fails any other value with "
                                 "`unsupported_version`."}
    props["min_tokens"]["description"] = "At most `max_tokens` (else `malformed`)."
    props["seed"]["description"] = ("Per-request sampling seed. Bounded to 2^53-1 so every "
                                    "JSON parser holds it exactly.")
    props["tenant"]["description"] = ("Optional: the stream names the tenant. A payload "
                                      "naming another tenant fails with `tenant_mismatch`.")
    props["priority"]["description"] = ("Informational: the lane is the stream the request "
                                        "is added to.")
    union = props["structured"]["anyOf"][0]["anyOf"]  # msgspec's tagged union, less its discriminator
    props["structured"] = {"oneOf": [*union, {"type": "null"}], "default": None,
                           "description": "Constrains the output; told apart by `type`. A spec "
                                          "the worker cannot compile (or a JSON Schema over "
                                          f"{L.MAX_STRUCTURED_SPEC_CHARS} characters as compact "
                                          "JSON) fails with `invalid_grammar`."}
    request["description"] += (
        "\n\nNot expressible in this schema (see docs/protocol.md): `min_tokens <= "
        f"max_tokens`; integers written without fraction or exponent; at most "
        f"{L.MAX_PAYLOAD_BYTES} bytes of UTF-8; no key repeated.")


def protocol_schema() -> dict[str, Any]:
    """One document: ``$defs`` for every type, ``Request`` (inbound), ``Event`` (outbound)
    and ``Cancel`` at the top; ``TenantConfig`` (a registry entry) in ``$defs``."""
    (request_ref, event_ref, cancel_ref, _), defs = msgspec.json.schema_components(
        [Request, Event, Cancel, TenantConfig])
    for (name, prop), schema in _OUTBOUND.items():
        defs[name]["properties"][prop] = schema
    _exact_request(defs["Request"])
    defs["TenantConfig"]["properties"]["lanes"]["uniqueItems"] = True
    event_ref["oneOf"] = event_ref.pop("anyOf")
    del event_ref["discriminator"]  # OpenAPI, not JSON Schema: strict validators refuse it
    _bound_integers(defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "fleet protocol",
        "description": "Request: the JSON in a stream entry's `data` field. Event: what is "
                       "published on a request's channel and stored as its progress/result. "
                       "Cancel: the notice on a model's control channel. TenantConfig: a "
                       "value of the tenant registry hash. docs/protocol.md is the "
                       "specification.",
        "$defs": {**defs, "Event": event_ref},
        "oneOf": [request_ref, {"$ref": "#/$defs/Event"}, cancel_ref],
    }


def render() -> str:
    return json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
