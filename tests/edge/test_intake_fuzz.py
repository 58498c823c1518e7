"""The intake fuzzed for real: hypothesis draws hostile stream entries (random bytes, wrong
types, extreme numbers, deep nesting, giant strings and lists, odd unicode, invalid ids and
tenants, wrong versions, entries without ``data``), XADDs them raw between valid requests,
and two real worker processes on a real redis-server serve the lot.

Asserted after every example: no worker exits; every valid request gets its reference
tokens; every entry with a readable id gets exactly one terminal event on its channel (and
the same one stored); every failed or unaddressable entry is dead-lettered; every entry
ends acknowledged, nothing pending.
"""
from __future__ import annotations

import itertools
import json

import pytest
import redis
from fleet_harness import ChannelListener, WorkerFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, wait_until

from producer import FleetClient
from shared import codec, keys, limits, tenants
from shared.failures import is_rejection
from shared.tenants import TenantConfig
from shared.protocol import Token

STREAM = keys.stream_key("default", "default", "default")
PROMPTS = [[1, 504, 3058, 314], [9876, 42, 7, 7, 7], [300, 301, 302, 303, 304, 305]]
VALID = dict(max_tokens=4, temperature=0.0, ignore_eos=True)
TENANTS = ["default", "acme"]
_counter = itertools.count()

scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20) \
    | st.floats(allow_nan=False, allow_infinity=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)
fields = st.sampled_from(["prompt", "messages", "prompt_token_ids", "max_tokens", "top_k", "seed",
                          "temperature", "stop", "logprobs", "metadata", "priority", "deadline",
                          "min_tokens", "tenant", "v", "zz"])
extremes = st.sampled_from([2**63, 2**64, -2**63, 10**40, 1e308, -1e308, -1, 0, "",
                            "9" * 400, [], {}, True])
hostile = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("object"), st.dictionaries(fields, values, max_size=5)),
    st.tuples(st.just("extreme"), st.tuples(fields, extremes)),
    st.tuples(st.just("deep"), st.tuples(st.integers(limits.MAX_JSON_DEPTH + 1, 60_000),
                                         st.sampled_from(["metadata", "v", "zz", "prompt"]))),
    st.tuples(st.just("giant"), st.sampled_from(["prompt", "metadata", "stop", "tokens"])),
    st.tuples(st.just("unicode"), st.text(alphabet=st.characters(codec="utf-8"), max_size=50)),
    st.tuples(st.just("bad_id"), st.sampled_from(["", " x", "{t}", "a" * 200, "é", "a*b"])),
    st.tuples(st.just("bad_tenant"), st.sampled_from(["", "{t}", "x y", 5])),
    st.tuples(st.just("version"), st.sampled_from([0, 2, 99, -1, "1", None])),
    st.tuples(st.just("no_data"), st.binary(max_size=50)),
)


def _entry(kind: str, param, request_id: str, tenant: str) -> tuple[dict, str | None]:
    """The entry's fields and the request id a client would wait on (None: unaddressable)."""
    base = {"request_id": request_id, "tenant": tenant, "prompt": "hi"}
    if kind == "bytes":
        return {"data": param}, None
    if kind == "object":
        return {"data": json.dumps({**param, "request_id": request_id, "tenant": tenant})}, request_id
    if kind == "extreme":
        return {"data": json.dumps({**base, param[0]: param[1]})}, request_id
    if kind == "deep":
        depth, where = param
        return {"data": json.dumps(base)[:-1] + f', "{where}": ' + "[" * depth + "]" * depth + "}"}, request_id
    if kind == "giant":
        big = {"prompt": {"prompt": "x" * 600_000}, "metadata": {"metadata": {"k": "v" * 5000}},
               "stop": {"stop": ["s"] * 1000}, "tokens": {"prompt": None, "prompt_token_ids": [1] * 40_000}}
        return {"data": json.dumps({**base, **big[param]})}, request_id
    if kind == "unicode":
        return {"data": json.dumps({**base, "prompt": param, "max_tokens": 2})}, request_id
    if kind == "bad_id":
        return {"data": json.dumps({**base, "request_id": param})}, None
    if kind == "bad_tenant":
        return {"data": json.dumps({**base, "tenant": param})}, None
    if kind == "version":
        return {"data": json.dumps({**base, "v": param})}, request_id
    return {"other": param}, None  # no_data


class Channels(ChannelListener):
    """Every event published on any request channel, by tenant/request id."""

    def __init__(self, url: str) -> None:
        self.events: dict[str, list] = {}
        super().__init__(url, pattern="fleet:req:*:events")

    def on_event(self, channel: str, event) -> None:
        tag = channel.split("{")[1].split("}")[0]
        self.events.setdefault(tag, []).append(event)

    def terminals(self, tenant: str, request_id: str) -> list:
        return [e for e in self.events.get(f"{tenant}/{request_id}", []) if not isinstance(e, Token)]


@pytest.fixture(scope="module")
def fleet_under_fuzz(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    server = RedisServer().start()
    redis.Redis.from_url(server.url).hset(keys.tenants_key(), mapping={
        t: tenants.encode(TenantConfig(name=t, lanes=list(keys.LANES))) for t in TENANTS})
    tmp = tmp_path_factory.mktemp("fuzz")
    factory = WorkerFactory(server, make_tiny_model(tmp / "tiny"), tmp)
    procs = [factory.start(), factory.start()]
    client = redis.Redis.from_url(server.url)
    with FleetClient(server.url) as fleet:
        reference = {tuple(p): fleet.generate(prompt_token_ids=p, timeout=60, **VALID).token_ids
                     for p in PROMPTS}
    yield server, client, procs, reference, Channels(server.url)
    factory.cleanup()
    server.stop()


@settings(max_examples=14, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(st.lists(hostile, min_size=4, max_size=16), st.lists(st.integers(0, len(PROMPTS) - 1),
                                                           min_size=2, max_size=6),
       st.randoms(use_true_random=False))
def test_hostile_entries_interleaved_with_valid_traffic(fleet_under_fuzz, entries, prompts, rnd):
    server, r, procs, reference, channels = fleet_under_fuzz
    example = next(_counter)
    dead_before = r.xlen(keys.dead_letter_key("default"))
    addressed, unaddressable = [], 0
    plan = [("hostile", e) for e in entries] + [("valid", p) for p in prompts]
    rnd.shuffle(plan)
    with FleetClient(server.url) as fleet:
        valid = []
        for i, (what, item) in enumerate(plan):
            if what == "valid":
                valid.append((PROMPTS[item], fleet.submit(prompt_token_ids=PROMPTS[item], **VALID)))
                continue
            tenant = TENANTS[i % 2]
            entry_fields, request_id = _entry(*item, f"fz{example}-{i}", tenant)
            r.xadd(keys.stream_key("default", tenant, "default"), entry_fields)  # its own stream
            if request_id is None:
                unaddressable += 1
            else:
                addressed.append((tenant, request_id))
        for prompt, stream in valid:
            assert stream.result(timeout=60).token_ids == reference[tuple(prompt)]
    for tenant, request_id in addressed:
        wait_until(lambda: channels.terminals(tenant, request_id), timeout=60,
                   what=f"a terminal event for {tenant}/{request_id}")
    streams = [keys.stream_key("default", t, "default") for t in TENANTS]
    wait_until(lambda: all(r.xlen(s) == 0 and r.xpending(s, keys.GROUP)["pending"] == 0
                           for s in streams), timeout=30, what="every entry acknowledged")
    failures = 0
    for tenant, request_id in addressed:
        (terminal,) = channels.terminals(tenant, request_id)  # exactly one
        stored = r.hget(keys.state_key(tenant, request_id), "result")
        assert codec.decode_event(stored) == terminal
        failures += terminal.__class__.__name__ == "Failure" and not is_rejection(terminal.code)
    # every dead letter, and none for a rejection (a client's validation failure)
    assert r.xlen(keys.dead_letter_key("default")) - dead_before == unaddressable + failures
    assert all(p.proc.poll() is None for p in procs), "a worker exited"
