"""The `structured` field: the JSON Schema accepts exactly what the decoder accepts, at,
inside and just outside every bound of every kind."""
from __future__ import annotations

import json

from shared import codec, errors, limits as L
from tests.shared.schema_check import decoder_accepts, validator

BASE = {"request_id": "r-1", "prompt": "hi"}
N, C, K = L.MAX_STRUCTURED_SPEC_CHARS, L.MAX_CHOICE_CHARS, L.MAX_CHOICES


def corpus() -> list:
    values = [None, {}, [], "json_object", {"type": "json_object"}, {"type": "json_object", "x": 1},
              {"type": "nope"}, {"type": None}, {"type": "json_schema"}, {"type": "json_schema", "schema": {}},
              {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
              {"type": "json_schema", "schema": []}, {"type": "json_schema", "schema": "x"},
              {"type": "json_schema", "schema": {}, "strict": True}]
    for field, kind, top in (("pattern", "regex", N), ("ebnf", "grammar", N)):
        values += [{"type": kind}, {"type": kind, field: ""}, {"type": kind, field: "a"},
                   {"type": kind, field: "a" * top}, {"type": kind, field: "a" * (top + 1)},
                   {"type": kind, field: 5}, {"type": kind, field: None}, {"type": kind, "choices": ["a"]}]
    values += [{"type": "choice"}, {"type": "choice", "choices": []}, {"type": "choice", "choices": ["a"]},
               {"type": "choice", "choices": ["a"] * K}, {"type": "choice", "choices": ["a"] * (K + 1)},
               {"type": "choice", "choices": [""]}, {"type": "choice", "choices": ["c" * C]},
               {"type": "choice", "choices": ["c" * (C + 1)]}, {"type": "choice", "choices": [1]},
               {"type": "choice", "choices": "a"}, {"type": "choice", "choices": ["\U0001F600" * C]}]
    return [{**BASE, "structured": v} for v in values]


def test_the_schema_and_the_decoder_agree_on_structured():
    check = validator("Request")
    cases = corpus()
    disagree = [json.dumps(p)[:120] for p in cases if check.is_valid(p) != decoder_accepts(p)]
    assert not disagree, disagree
    accepted = sum(decoder_accepts(p) for p in cases)
    assert 10 < accepted < len(cases) - 10   # both sides of every bound are in the corpus


def _nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_json_schema_nested_past_the_depth_limit_is_too_deep():
    ok = {**BASE, "structured": {"type": "json_schema", "schema": _nested_schema(25)}}   # 28 levels: within 64
    assert codec.decode_request(json.dumps(ok).encode()).structured.schema["type"] == "array"
    deep = {**BASE, "structured": {"type": "json_schema", "schema": _nested_schema(70)}}
    try:
        codec.decode_request(json.dumps(deep).encode())
    except errors.ProtocolError as exc:
        assert exc.code == errors.TOO_DEEP and exc.request_id == "r-1"
    else:
        raise AssertionError("a schema nested 73 levels deep was accepted")
