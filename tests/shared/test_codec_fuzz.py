"""The codec alone under hostile input (property-based): it raises ProtocolError and
nothing else, never recurses, and finds the id of an addressable entry."""
from __future__ import annotations

import json
import time

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared import codec, errors, limits
from shared.protocol import Request, StructuredJsonSchema
from shared.scan import scan

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_scalars = st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80) \
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=30)
field_names = st.sampled_from(["v", "request_id", "tenant", "prompt", "messages",
                               "prompt_token_ids", "max_tokens", "min_tokens", "temperature",
                               "top_k", "top_p", "seed", "stop", "stop_token_ids", "logprobs",
                               "metadata", "deadline", "priority", "x", ""]) | st.text(max_size=10)
ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:\-]{0,30}\Z")


def _decode(raw):
    try:
        return codec.decode_request(raw)
    except errors.ProtocolError as exc:
        assert exc.code in (errors.MALFORMED, errors.TOO_LARGE, errors.TOO_DEEP,
                            errors.UNSUPPORTED_VERSION)
        return exc


@FUZZ
@given(st.binary(max_size=2000))
@example(b"[" * 100_000)
@example(b'{"request_id": "a", "v": ' + b"[" * 200_000)
@example(b'"\\"' * 50_000)
def test_random_bytes_raise_only_protocol_errors(raw):
    _decode(raw)
    scan(raw)


@FUZZ
@given(st.dictionaries(field_names, json_values, max_size=8))
def test_random_objects_raise_only_protocol_errors(obj):
    result = _decode(json.dumps(obj).encode())
    if isinstance(result, errors.ProtocolError) and result.request_id is not None:
        assert result.request_id == obj["request_id"]  # only ever the top-level id


@FUZZ
@given(ids, st.sampled_from(["metadata", "v", "stop", "junk", "prompt"]),
       st.integers(min_value=limits.MAX_JSON_DEPTH + 1, max_value=100_000),
       st.sampled_from(["[", '{"a":']))
def test_deep_nesting_anywhere_is_too_deep_and_addressable(request_id, where, depth, opener):
    closer = "]" if opener == "[" else "}"
    raw = (f'{{"request_id": "{request_id}", "prompt": "hi", "{where}": '
           + opener * depth + "1" + closer * depth + "}").encode()
    exc = _decode(raw)
    assert isinstance(exc, errors.ProtocolError) and exc.code == errors.TOO_DEEP
    assert (exc.request_id, exc.tenant) == (request_id, None)  # the stream names the tenant


def test_deep_nesting_before_the_id_is_unaddressable_not_fatal():
    raw = b'{"x": ' + b"[" * 10_000 + b"]" * 10_000 + b', "request_id": "r"}'
    exc = _decode(raw)
    assert exc.code == errors.TOO_DEEP and exc.request_id is None


@pytest.mark.parametrize("size", [limits.MAX_PAYLOAD_BYTES + 1, 3 * limits.MAX_PAYLOAD_BYTES])
def test_an_oversized_payload_keeps_its_id(size):
    head = b'{"tenant": "acme", "request_id": "big-1", "prompt": "'
    raw = head + b"x" * (size - len(head) - 2) + b'"}'
    exc = _decode(raw)
    assert exc.code == errors.TOO_LARGE and (exc.tenant, exc.request_id) == ("acme", "big-1")


@pytest.mark.parametrize("raw", [
    b'{"request_id": "r", "metadata": {"request_id": "victim"}, "x": 1}',  # nested: not the id
    b'{"prompt": "\\"request_id\\": \\"victim\\"", "x": 1}',  # inside a string: not a key
    b'{"request_id": "has space", "x": 1}',  # not a valid id
    b'{"request_id": 5, "x": 1}',
])
def test_only_a_top_level_valid_id_addresses_a_failure(raw):
    exc = _decode(raw)
    assert exc.request_id in (None, "r")


def test_the_scan_is_linear_on_pathological_strings():
    for raw in (b'"\\"' * 150_000, b'["' * 200_000, b'"' + b"\\" * 400_000,
                b'{"a":"b",' * 50_000):
        t0 = time.perf_counter()
        scan(raw)
        # Quadratic behaviour would take minutes here; linear takes milliseconds.
        assert time.perf_counter() - t0 < 2.0


valid_requests = st.builds(
    Request, request_id=ids, prompt=st.text(max_size=200),
    max_tokens=st.integers(1, limits.MAX_TOKENS), temperature=st.floats(0, 100),
    top_k=st.integers(0, limits.MAX_TOP_K), seed=st.none() | st.integers(0, limits.MAX_SAFE_INTEGER),
    stop=st.lists(st.text(min_size=1, max_size=20), max_size=limits.MAX_STOP_STRINGS),
    metadata=st.dictionaries(st.text(max_size=20), st.text(max_size=50), max_size=5))


@FUZZ
@given(valid_requests)
def test_valid_requests_round_trip(request):
    assert codec.decode_request(codec.encode(request)) == request


@FUZZ
@given(valid_requests, st.sampled_from(["top_k", "seed", "max_tokens", "logprobs", "min_tokens",
                                        "deadline", "submitted_at", "temperature"]),
       st.sampled_from([2**63, 2**64, -1, 10**30, 1e300, -1e300, "1", True, None, []]))
def test_extreme_numbers_are_refused_at_decode(request, field, value):
    obj = msgspec.json.decode(codec.encode(request))
    obj[field] = value
    result = _decode(json.dumps(obj).encode())
    if isinstance(result, Request):  # accepted: then it is within what the engine takes
        assert result.top_k <= limits.MAX_TOP_K and (result.seed is None or result.seed <= limits.MAX_SAFE_INTEGER)
        assert result.deadline is None or result.deadline <= limits.MAX_UNIX_TIME
    else:
        assert result.request_id == request.request_id


def test_the_request_schema_bounds_nesting_by_itself():
    """The typed decode of a Request never recurses deeper than its schema, because no
    field is ``Any``, untyped or recursive: the depth scan then only runs on failures. A
    field that breaks this (say ``dict[str, Any]`` for a JSON schema) fails this test, and
    the payload must then be depth-scanned before the decode."""
    import msgspec.inspect as mi

    def depth(t, seen=()) -> int:
        if isinstance(t, mi.StructType) and t.cls is StructuredJsonSchema:
            return 1   # its schema is untyped: the codec depth-scans such requests (test_schema_structured)
        if isinstance(t, (mi.AnyType, mi.CustomType)):
            raise AssertionError(f"unbounded field type {t!r} in Request")
        if isinstance(t, mi.StructType):
            assert t.cls not in seen, f"recursive type {t.cls.__name__}"
            return 1 + max((depth(f.type, seen + (t.cls,)) for f in t.fields), default=0)
        if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            return 1 + depth(t.item_type, seen)
        if isinstance(t, mi.DictType):
            return 1 + max(depth(t.key_type, seen), depth(t.value_type, seen))
        if isinstance(t, mi.TupleType):
            return 1 + max((depth(x, seen) for x in t.item_types), default=0)
        if isinstance(t, mi.UnionType):
            return max(depth(x, seen) for x in t.types)
        return 0

    assert depth(mi.type_info(Request)) <= 4 < limits.MAX_JSON_DEPTH
