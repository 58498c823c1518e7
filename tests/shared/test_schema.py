"""The JSON Schema says exactly what the worker's decoder accepts.

A corpus of requests at, inside and just outside every bound of every field (read from the
schema itself, so a new field is covered without touching this file) is validated by the
schema and decoded by :func:`shared.codec.decode_request`; the two must agree, except where
a named, documented rule no JSON Schema can state says otherwise. The same corpus is
checked with Ajv (the JavaScript validator) in ``tests/conformance``.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from shared import codec, errors, limits
from shared.protocol import Failure, Result, Timings, Token, TokenLogprob, Usage
from shared.schema import MAX_SAFE_INTEGER, protocol_schema
from shared.tenants import IMPLICIT_DEFAULT, TenantConfig
from shared.tenants import encode as encode_tenant
from tests.shared.schema_check import decoder_accepts, validator

BASE = {"request_id": "r-1", "prompt": "hi"}
PROMPT_FORMS = ("prompt", "messages", "prompt_token_ids")

# Cases where the schema and the decoder may disagree, and why (docs/protocol.md says so).
KNOWN_GAPS: dict[str, str] = {}  # none left: the decoder bounds seed to 2^53-1 too


def _non_null(schema: dict) -> dict:
    branches = [b for b in schema.get("anyOf", [schema]) if b.get("type") != "null"]
    return branches[0]


def _resolve(schema: dict, defs: dict) -> dict:
    if "$ref" in schema:
        return defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def candidate_values(schema: dict, defs: dict) -> list:
    """Values at, inside and just outside the bounds of ``schema`` (one property)."""
    nullable = "anyOf" in schema and any(b.get("type") == "null" for b in schema["anyOf"])
    s = _resolve(_non_null(schema), defs)
    out: list = [None, True, "1", [], {}]
    if "const" in s:
        out += [s["const"], s["const"] + 1, 0]
    elif "enum" in s:
        out += [*s["enum"], "nope", ""]
    elif s.get("type") == "integer":
        lo, hi = s["minimum"], s["maximum"]
        out += [lo, lo - 1, hi, hi + 1, (lo + hi) // 2, 0.5, lo + 0.5]
    elif s.get("type") == "number":
        lo = s.get("minimum", s.get("exclusiveMinimum"))
        hi = s.get("maximum")
        out += [lo, lo - 1, lo + 1e-9, hi, hi + 1, hi * (1 + 1e-9), (lo + hi) / 2, 1, 1e308]
    elif s.get("type") == "string":
        n = s.get("maxLength", 128)
        out += ["", "a", "a" * n, "a" * (n + 1), "\U0001F600" * min(n, 1000), "has space",
                "a\n", "{tag}", "Z9._:-", "-lead", 5]
        if "minLength" in s:
            out += ["a" * s["minLength"]]
    elif s.get("type") == "array":
        n = s.get("maxItems", 4)
        items = s.get("items", {})
        good = _good_item(items, defs)
        out += [[good], [good] * n, [good] * (n + 1)]
        out += [[bad] for bad in candidate_values(items, defs)[:12] if bad != good]
    elif s.get("type") == "object" and "properties" in s:  # a chat message
        good = {"role": "user", "content": "hi"}
        out += [good, {"role": "user"}, {**good, "role": "robot"}, {**good, "name": "x"},
                {**good, "content": "c" * s["properties"]["content"]["maxLength"]},
                {**good, "content": "c" * (s["properties"]["content"]["maxLength"] + 1)},
                {**good, "content": None}]
    elif s.get("type") == "object":  # metadata: a map of bounded strings
        k, v = s["propertyNames"]["maxLength"], s["additionalProperties"]["maxLength"]
        n = s["maxProperties"]
        out += [{"a": "b"}, {f"k{i}": "v" for i in range(n)}, {f"k{i}": "v" for i in range(n + 1)},
                {"x" * k: "y" * v}, {"x" * (k + 1): "y"}, {"x": "y" * (v + 1)}, {"a": 1},
                {"": ""}, {"\U0001F600" * k: "\U0001F600" * v}]
    elif s.get("type") == "boolean":
        out += [False, 0]
    if nullable:
        out.append(None)
    return out


def _good_item(items: dict, defs: dict):
    items = _resolve(items, defs)
    if items.get("type") == "integer":
        return items["minimum"]
    if items.get("type") == "string":
        return "a"
    return {"role": "user", "content": "hi"}  # ChatMessage


def _case(field: str, value) -> dict:
    payload = dict(BASE)
    if field in PROMPT_FORMS and value is not None:
        payload.pop("prompt")
    if field == "min_tokens":  # within max_tokens: that rule is tested on its own
        payload["max_tokens"] = limits.MAX_TOKENS
    payload[field] = value
    return payload


def request_corpus() -> list[tuple[str, dict]]:
    """(label, request object) for every field and candidate value, plus prompt-form mixes."""
    defs = protocol_schema()["$defs"]
    cases = [("base", dict(BASE))]
    for field, schema in sorted(defs["Request"]["properties"].items()):
        for value in candidate_values(schema, defs):
            text = json.dumps(value)
            cases.append((f"{field}={text if len(text) < 40 else text[:30] + '...'}",
                          _case(field, value)))
    forms = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
             "prompt_token_ids": [1, 2]}
    for mask in range(8):
        for null_rest in (False, True):
            payload = {"request_id": "r-1"}
            for i, name in enumerate(PROMPT_FORMS):
                if mask >> i & 1:
                    payload[name] = forms[name]
                elif null_rest:
                    payload[name] = None
            cases.append((f"forms={mask}/{null_rest}", payload))
    cases += [("unknown field", {**BASE, "promt": "x"}), ("no id", {"prompt": "hi"}),
              ("not an object", [BASE]), ("a string", "hi")]
    return cases


def test_the_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(protocol_schema())


def test_the_schema_accepts_exactly_what_the_worker_decodes():
    check = validator("Request")
    corpus = request_corpus()
    disagree = [(label, check.is_valid(payload), decoder_accepts(payload))
                for label, payload in corpus
                if check.is_valid(payload) != decoder_accepts(payload) and label not in KNOWN_GAPS]
    assert len(corpus) > 300
    assert not disagree, disagree


def test_every_integer_is_one_a_double_holds_exactly():
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("type") == "integer":
                found.append(path)
                assert -MAX_SAFE_INTEGER <= node["minimum"] <= node["maximum"] <= MAX_SAFE_INTEGER, path
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(protocol_schema(), "#")
    assert len(found) > 15


@pytest.mark.parametrize("payload, code", [
    ({**BASE, "min_tokens": 17, "max_tokens": 16}, errors.MALFORMED),  # cross-field rule
    ({**BASE, "max_tokens": 16.0}, errors.MALFORMED),  # JSON Schema calls 16.0 an integer
    ({"request_id": "r-1", "messages": [{"role": "user", "content": "x" * limits.MAX_MESSAGE_CHARS}]
      * (limits.MAX_PAYLOAD_BYTES // limits.MAX_MESSAGE_CHARS + 1)}, errors.TOO_LARGE),
])
def test_rules_no_schema_states_are_documented_and_enforced(payload, code):
    """The schema accepts these; the worker refuses them; docs/protocol.md says so."""
    assert validator("Request").is_valid(payload)
    with pytest.raises(errors.ProtocolError) as err:
        codec.decode_request(json.dumps(payload).encode())
    assert err.value.code == code


def test_the_prompt_forms_are_one_of():
    check = validator("Request")
    assert check.is_valid({"request_id": "a", "messages": [], "prompt": None})
    assert not check.is_valid({"request_id": "a", "prompt": "x", "prompt_token_ids": [1]})
    assert not check.is_valid({"request_id": "a", "prompt": None})


def test_events_and_cancel_validate_against_the_whole_document():
    check = jsonschema.Draft202012Validator(protocol_schema())
    events = [
        Token(request_id="r-1", seq=0, token_ids=[5, 6], text="ab",
              logprobs=[TokenLogprob(token_id=5, logprob=-0.1, top=[(5, -0.1), (7, -2.0)]),
                        TokenLogprob(token_id=6, logprob=-0.2)]),
        Result(request_id="r-1", finish_reason="stop", stop_reason=2, text="ab",
               token_ids=[5, 6], usage=Usage(prompt_tokens=3, completion_tokens=2),
               timings=Timings(queued_s=0.1, ttft_s=0.2, total_s=0.3), worker_id="w"),
        Failure(request_id="r-1", code="tenant_mismatch", message="m"),
    ]
    for event in events:
        check.validate(json.loads(codec.encode(event)))
    check.validate({"type": "cancel", "request_id": "r-1", "tenant": "acme"})
    bad = json.loads(codec.encode(events[0]))
    for field, value in (("seq", -1), ("token_ids", []), ("token_ids", [-1]), ("type", "tok")):
        assert not check.is_valid({**bad, field: value}), field


def test_a_registry_entry_validates():
    check = validator("TenantConfig")
    check.validate(json.loads(encode_tenant(IMPLICIT_DEFAULT)))
    check.validate(json.loads(encode_tenant(TenantConfig(name="acme", lanes=["high"], weight=2))))
    assert not check.is_valid({"name": "acme", "lanes": ["high", "high"]})
