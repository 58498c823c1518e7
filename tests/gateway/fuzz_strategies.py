"""Hypothesis strategies for the gateway fuzz: hostile bodies, near-valid requests with
hostile fields, headers, methods and paths.

Requests that could be valid go to ``tiny`` (served by a worker) only while they are cheap
to generate (a few tokens, a short prompt); otherwise to ``idle``, whose queue is kept full,
so that a valid one is answered 503 at once instead of generating for minutes.
"""
from __future__ import annotations

import json
import string
from urllib.parse import quote

from hypothesis import strategies as st

CHEAP_MAX_TOKENS = 6
CHEAP_BODY_BYTES = 4000
ODD_STRINGS = ["", "\u0000", "\ufeff", "\u202e\u0627\u0644", "e\u0301\u0301\u0301", "\U0010ffff",
               "𝕏" * 40, "\\", '"', "\r\n\t", "<|im_start|>system", "null", "{{}}", "%s%n"]
EXTREME_NUMBERS = [0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 10**40, 1e308,
                   -1e308, 5e-324, 0.5, -0.0, 1e-7, 16385]
FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty", "user",
          "stream", "stream_options", "logprobs", "top_logprobs", "top_k", "min_p",
          "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "request_id",
          "metadata", "tools", "tool_choice", "response_format", "echo", "suffix", "best_of"]

odd_text = st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=60),
                     st.text(st.characters(codec="utf-8"), max_size=60))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(EXTREME_NUMBERS),
                    st.floats(allow_nan=False, allow_infinity=False), odd_text)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["role", "content", "type", "text", "x"]) | odd_text,
                      inner, max_size=4), max_leaves=10)
giant_text = st.integers(10_000, 120_000).map(lambda n: "ß" * n)


def _base(chat: bool) -> dict:
    if chat:
        return {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2, "temperature": 0}
    return {"model": "tiny", "prompt": "Once upon", "max_tokens": 2, "temperature": 0}


def _cheap(body: dict, chat: bool) -> bool:
    """Whether the request, if valid, generates only a few tokens from a short prompt."""
    default = 256 if chat else 16  # the gateway's defaults
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    chosen = [body.get(k) for k in names]
    chosen = [v for v in chosen if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    limit = chosen[0] if chosen else default
    return limit <= CHEAP_MAX_TOKENS and len(json.dumps(body)) <= CHEAP_BODY_BYTES


@st.composite
def mutated_requests(draw) -> tuple[str, dict]:
    """(path, body): a valid chat or completion body with one to three fields (or message
    fields) set to hostile values, deleted, or added."""
    chat = draw(st.booleans())
    body = _base(chat)
    for _ in range(draw(st.integers(1, 3))):
        value = draw(json_values | giant_text | st.sampled_from(EXTREME_NUMBERS))
        where = draw(st.sampled_from(["field", "field", "delete", "message", "extra"]))
        if where == "field":
            body[draw(st.sampled_from(FIELDS))] = value
        elif where == "delete":
            body.pop(draw(st.sampled_from(sorted(body))), None)
        elif where == "message" and isinstance(body.get("messages"), list) and body["messages"]:
            message = body["messages"][0]
            if isinstance(message, dict):
                message[draw(st.sampled_from(["role", "content", "name", "x"]))] = value
        else:
            body[draw(odd_text)] = value
    if body.get("model") == "tiny" and not _cheap(body, chat):
        body["model"] = "idle"
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def _nested(depth: int, field: str) -> bytes:
    base = b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":1,'
    return base + f'"{field}":'.encode() + b"[" * depth + b"]" * depth + b"}"


raw_bodies = st.one_of(
    st.binary(max_size=2000),
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_requests().map(lambda pb: json.dumps(pb[1]).encode()).flatmap(
        lambda raw: st.integers(0, len(raw) - 1).map(lambda cut: raw[:cut])),  # truncated
    st.integers(500, 100_000).map(lambda n: b"[" * n + b"]" * n),
    st.tuples(st.integers(900, 100_000), st.sampled_from(["tool_choice", "tools", "prompt",
                                                          "response_format", "metadata"]))
    .map(lambda t: _nested(*t)),
    (st.sampled_from([150_000, 524_000, 590_000]) | st.integers(100_000, 700_000)).map(
        lambda n: b'{"model":"idle","prompt":"' + b"a" * n + b'"}'),
    st.sampled_from([b'{"model":"tiny","prompt":"\\ud800"}', b'{"model":"tiny","prompt":"\xff"}',
                     b'{"model":"tiny","prompt":NaN}', b'{"model":"tiny","max_tokens":1e999}',
                     b"\xef\xbb\xbf{}", b"", b"null", b'{"model":"tiny"}' * 3]),
)

_header_value = st.binary(max_size=80).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128).strip())
_header_name = st.text(string.ascii_letters + string.digits + "-_.!#$%&'*+^`|~", min_size=1,
                       max_size=20).filter(lambda n: n.lower() not in {
                           "content-length", "transfer-encoding", "host", "connection",
                           "expect", "upgrade", "te", "trailer", "keep-alive"})
# Mostly the right key, so that most bodies get past authentication to be decoded.
_authorization = st.integers(0, 9).flatmap(lambda i: st.just(b"Bearer sk-fuzz") if i < 7 else (
    st.sampled_from([b"Bearer sk-nope", b"bearer  sk-fuzz", b"Basic Zm9vOmJhcg==", b""])
    | _header_value))
headers = st.fixed_dictionaries({"authorization": _authorization}, optional={
    "content-type": st.sampled_from([b"application/json", b"text/plain", b"application/x-www-"
                                     b"form-urlencoded", b"multipart/form-data; boundary=x",
                                     b"application/json; charset=latin-1"]) | _header_value,
}).flatmap(lambda fixed: st.dictionaries(_header_name, _header_value, max_size=3).map(
    lambda extra: {**extra, **fixed}))

methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]) \
    | st.text(string.ascii_uppercase, min_size=1, max_size=8).filter(lambda m: m != "CONNECT")
paths = st.sampled_from(["/health", "/ready", "/v1/models", "/v1/chat/completions",
                         "/v1/completions", "/v1/chat/completions/", "//v1/models", "/v1",
                         "/v1/models?x=%00", "/%2e%2e/etc/passwd", "/v1/embeddings", "/"]) \
    | st.lists(odd_text, max_size=4).map(lambda s: "/" + "/".join(quote(p, safe="") for p in s))
