"""Hostile entries against real workers on a real redis-server: each reproduced a fleet-wide
outage before the hardened intake (issue 14) and must now end that entry alone."""
from __future__ import annotations

import json

import pytest
from redis_server import wait_until

from producer import FleetClient, RequestFailed
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
STREAM = keys.stream_key("default", "default", "default")
GREEDY = dict(prompt_token_ids=PROMPT, max_tokens=6, temperature=0.0, ignore_eos=True)


def _failure_code(stream, timeout: float = 30) -> str:
    with pytest.raises(RequestFailed) as err:
        stream.result(timeout=timeout)
    return err.value.code


def _all_acked(r) -> None:
    wait_until(lambda: r.xlen(STREAM) == 0 and r.xpending(STREAM, keys.GROUP)["pending"] == 0,
               timeout=20, what="every entry acknowledged and deleted")


def _deep(request_id: str | None, depth: int = 5000, where: str = "metadata") -> str:
    head = f'"request_id": "{request_id}", ' if request_id else ""
    return '{' + head + '"prompt": "hi", "' + where + '": ' + "[" * depth + "]" * depth + "}"


def test_deeply_nested_entries_mixed_into_traffic_end_alone(workers, redis_server, r):
    """Before: RecursionError killed each worker in turn; 0 of 20 valid requests served."""
    procs = [workers.start(), workers.start()]
    with FleetClient(redis_server.url) as fleet:
        reference = fleet.generate(timeout=30, **GREEDY).token_ids
        watched, valid = [], []
        for i in range(20):
            if i % 2 == 0:
                watched.append(fleet.watch(f"deep-{i}"))
                r.xadd(STREAM, {"data": _deep(f"deep-{i}", where=("metadata", "v")[i % 4 // 2])})
                r.xadd(STREAM, {"data": _deep(None, depth=20_000)})
            valid.append(fleet.submit(**GREEDY))
        assert all(s.result(timeout=60).token_ids == reference for s in valid)
        assert {_failure_code(s) for s in watched} == {"too_deep"}
    assert all(p.proc.poll() is None for p in procs)
    _all_acked(r)
    codes = [d[1][b"code"] for d in r.xrange(keys.dead_letter_key("default"))]
    assert codes.count(b"too_deep") == 20


def test_an_oversized_payload_with_a_readable_id_gets_a_failure(workers, redis_server, r):
    """Before: dead-lettered before its id was read; its client waited forever."""
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.watch("huge")
        r.xadd(STREAM, {"data": json.dumps({"request_id": "huge", "prompt": "x" * 600_000})})
        assert _failure_code(stream) == "too_large"
        assert fleet.generate(timeout=30, **GREEDY).token_ids
    _all_acked(r)


@pytest.mark.parametrize("field, value", [("top_k", 2**63), ("top_k", 2**64), ("seed", 2**64),
                                          ("logprobs", 10**6), ("deadline", 1e300)])
def test_extreme_numbers_are_typed_failures(workers, redis_server, r, field, value):
    """Before: top_k >= 2**63 passed decoding and killed the engine thread."""
    worker = workers.start()
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.watch("extreme")
        r.xadd(STREAM, {"data": json.dumps({"request_id": "extreme", "prompt": "hi", field: value})})
        assert _failure_code(stream) == "malformed"
        assert fleet.generate(timeout=30, **GREEDY).token_ids
    assert worker.proc.poll() is None
    _all_acked(r)


def test_the_delivery_count_ends_an_entry_before_it_is_parsed(workers, redis_server, r):
    """An entry that killed every worker that parsed it (simulated: delivered 6 times to a
    consumer that died) is dead-lettered as poison on the next delivery, unparsed."""
    r.xgroup_create(STREAM, keys.GROUP, id="0", mkstream=True)
    entry_id = r.xadd(STREAM, {"data": '{"request_id": "killer", "prompt": "hi", "bad": 1}'})
    r.xreadgroup(keys.GROUP, "ghost", {STREAM: ">"}, count=1)
    for _ in range(5):
        r.xclaim(STREAM, keys.GROUP, "ghost", 0, [entry_id], idle=10_000)
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.watch("killer")
        workers.start(max_deliveries=5)
        assert _failure_code(stream) == "poison"  # not "malformed": it was never parsed
    _all_acked(r)
    (dead,) = r.xrange(keys.dead_letter_key("default"))
    assert dead[1][b"code"] == b"poison" and int(dead[1][b"deliveries"]) == 7
    assert dead[1][b"reason"] == b"poison"


def test_entries_without_data_or_with_odd_fields_are_dead_lettered(workers, redis_server, r):
    workers.start()
    r.xadd(STREAM, {"nodata": "1"})
    r.xadd(STREAM, {"data": b"\xff\xfe\x00 binary"})
    r.xadd(STREAM, {"data": "", "extra": "x" * 1000})
    r.xadd(STREAM, {"data": '"just a string"'})
    r.xadd(STREAM, {"data": '{"request_id": "\\ud800", "prompt": "x"}'})  # lone surrogate id
    with FleetClient(redis_server.url) as fleet:
        assert fleet.generate(timeout=30, **GREEDY).token_ids
    _all_acked(r)
    assert r.xlen(keys.dead_letter_key("default")) == 5


def test_the_client_refuses_what_the_fleet_would_and_leaves_no_subscription(redis_server, r):
    from producer import PayloadTooLarge

    with FleetClient(redis_server.url) as fleet:
        with pytest.raises(PayloadTooLarge):
            fleet.submit(prompt="\u20ac" * 190_000)  # within the character limit, 570 KB encoded
        r.config_set("maxmemory", "1")  # the XADD is refused: the client must not stay subscribed
        with pytest.raises(Exception, match="OOM|maxmemory|memory"):
            fleet.submit(prompt="hi", request_id="refused")
        r.config_set("maxmemory", "0")
        assert r.pubsub_numsub(keys.channel("default", "refused"))[0][1] == 0
    assert r.xlen(STREAM) == 0
