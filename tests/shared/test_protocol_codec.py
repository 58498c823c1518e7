"""The wire protocol: limits at decode, typed errors, hash-tagged keys, committed schema."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from shared import codec, errors, keys, limits
from shared.protocol import Failure, Request, Result, Timings, Token, Usage
from shared.schema import render

REPO = Path(__file__).resolve().parents[2]


def _raw(**fields) -> bytes:
    return json.dumps({"request_id": "r-1", "prompt": "hi", **fields}).encode()


def test_a_valid_request_round_trips():
    request = codec.decode_request(_raw(max_tokens=7, stop=["\n"], priority="high"))
    assert request.max_tokens == 7 and request.priority == "high"
    assert codec.decode_request(codec.encode(request)) == request


@pytest.mark.parametrize("payload, code", [
    (b"not json", errors.MALFORMED),
    (_raw(max_tokens=limits.MAX_TOKENS + 1), errors.MALFORMED),
    (_raw(unknown_field=1), errors.MALFORMED),
    (_raw(prompt_token_ids=[1, 2]), errors.MALFORMED),  # two prompts
    (_raw(request_id="has space"), errors.MALFORMED),
    (_raw(request_id="{tag}"), errors.MALFORMED),  # ids may not pick a hash slot
    (_raw(temperature=-1), errors.MALFORMED),
    (_raw(v=2), errors.UNSUPPORTED_VERSION),
    (_raw(prompt="x" * limits.MAX_PAYLOAD_BYTES), errors.TOO_LARGE),
])
def test_bad_payloads_raise_typed_errors(payload, code):
    with pytest.raises(errors.ProtocolError) as err:
        codec.decode_request(payload)
    assert err.value.code == code


def test_an_addressable_bad_payload_keeps_its_id():
    with pytest.raises(errors.ProtocolError) as err:
        codec.decode_request(_raw(tenant="acme", max_tokens=0))
    assert (err.value.tenant, err.value.request_id) == ("acme", "r-1")


def test_events_are_a_tagged_union():
    token = Token(request_id="r-1", seq=3, token_ids=[5], text="a")
    result = Result(request_id="r-1", finish_reason="stop", text="a", token_ids=[5],
                    usage=Usage(prompt_tokens=1, completion_tokens=1), timings=Timings())
    failure = Failure(request_id="r-1", code="poison", message="m")
    for event in (token, result, failure):
        assert codec.decode_event(codec.encode(event)) == event
    assert json.loads(codec.encode(token))["type"] == "token"


def test_request_keys_share_one_hash_tag_and_come_from_id_and_tenant_only():
    names = keys.request_keys("acme", "r-1")
    assert {n[n.index("{"): n.index("}") + 1] for n in names} == {"{acme/r-1}"}
    with pytest.raises(ValueError):
        keys.request_keys("acme", "x}y")


def test_committed_schema_is_up_to_date():
    assert (REPO / "docs" / "protocol.schema.json").read_text() == render()


def test_requests_convert_from_plain_dicts():
    request = msgspec.convert({"request_id": "a", "messages": [{"role": "user", "content": "hi"}]},
                              Request)
    assert request.messages[0].content == "hi"
