"""A worker serving through Redis: streaming, idempotency, cancel, deadlines, lanes."""
from __future__ import annotations

import time

import pytest
from redis_server import wait_until

from producer import FleetClient, RequestFailed
from shared import keys

STREAM_OF_DEFAULT = keys.stream_key("default", "default", "default")

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]


def _stream(fleet, **fields):
    stream = fleet.submit(**fields)
    tokens = list(stream)
    return tokens, stream.result(timeout=60)


def test_tokens_arrive_once_in_order_and_match_the_result(workers, redis_server, r):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        tokens, result = _stream(fleet, prompt_token_ids=PROMPT, max_tokens=40,
                                 temperature=0.0, ignore_eos=True)
    seqs = [t.seq for t in tokens]
    assert seqs == sorted(seqs) and seqs[0] == 0
    ids = [i for t in tokens for i in t.token_ids]
    assert ids == result.token_ids and len(ids) == 40
    assert "".join(t.text for t in tokens) == result.text
    assert result.finish_reason == "length" and result.usage.prompt_tokens == len(PROMPT)
    # acked and deleted: nothing pending, nothing left in the stream (the ack follows the
    # result by one round trip)
    stream_key = keys.stream_key("default", "default", "default")
    wait_until(lambda: r.xlen(stream_key) == 0 and r.xpending(stream_key, keys.GROUP)["pending"] == 0,
               timeout=10, what="entry acknowledged and deleted")
    assert r.ttl(keys.state_key("default", result.request_id)) > 0


def test_same_request_id_twice_generates_once(workers, redis_server, r):
    with FleetClient(redis_server.url) as fleet:
        first = fleet.submit(request_id="dup-1", prompt_token_ids=PROMPT, max_tokens=30,
                             temperature=0.0, ignore_eos=True)
        second = fleet.submit(request_id="dup-1", prompt_token_ids=PROMPT, max_tokens=30,
                              temperature=0.0, ignore_eos=True)
        assert r.xlen(keys.stream_key("default", "default", "default")) == 2
        workers.start()
        a, b = first.result(timeout=60), second.result(timeout=60)
        third = fleet.generate(request_id="dup-1", prompt_token_ids=PROMPT, max_tokens=30,
                               temperature=0.0, ignore_eos=True)  # the same request (id_conflict else)
    assert a.token_ids == b.token_ids == third.token_ids
    assert r.hget(keys.state_key("default", "dup-1"), "fence") == b"1"  # begun once
    assert r.llen(keys.progress_key("default", "dup-1")) == 30  # one event per token
    assert r.xlen(keys.stream_key("default", "default", "default")) == 0


def test_cancel_running_request(workers, redis_server):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(request_id="c-run", prompt_token_ids=PROMPT, max_tokens=1500,
                              temperature=0.0, ignore_eos=True)
        received = 0
        for token in stream:
            received += len(token.token_ids)
            if received >= 5:
                fleet.cancel("c-run")
                break
        result = stream.result(timeout=30)
    assert result.finish_reason == "cancelled"
    assert 5 <= len(result.token_ids) < 1500


def test_cancel_queued_request_and_deadline_before_start(workers, redis_server):
    with FleetClient(redis_server.url) as fleet:
        queued = fleet.submit(request_id="c-queued", prompt_token_ids=PROMPT, max_tokens=20)
        fleet.cancel("c-queued")
        late = fleet.submit(prompt_token_ids=PROMPT, max_tokens=20, deadline=time.time() + 0.2)
        time.sleep(0.3)
        workers.start()
        assert queued.result(timeout=30).finish_reason == "cancelled"
        timed_out = late.result(timeout=30)
        assert timed_out.finish_reason == "timeout" and timed_out.token_ids == []
        ok = fleet.generate(prompt_token_ids=PROMPT, max_tokens=3, timeout=30)
        assert ok.finish_reason == "length"


def test_deadline_stops_a_running_request(workers, redis_server):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        result = fleet.generate(prompt_token_ids=PROMPT, max_tokens=1800, ignore_eos=True,
                                deadline=time.time() + 1.0, timeout=30)
    assert result.finish_reason == "timeout"
    assert 0 < len(result.token_ids) < 1800


def test_higher_lane_is_served_first(workers, redis_server):
    with FleetClient(redis_server.url) as fleet:
        low = [fleet.submit(prompt_token_ids=PROMPT, max_tokens=8, priority="batch")
               for _ in range(4)]
        high = [fleet.submit(prompt_token_ids=PROMPT, max_tokens=8, priority="high")
                for _ in range(4)]
        workers.start(local_queue=1, max_num_seqs=1)
        results_high = [s.result(timeout=60) for s in high]
        results_low = [s.result(timeout=60) for s in low]
    last_high = max(x.timings.queued_s for x in results_high)
    first_low = min(x.timings.queued_s for x in results_low)
    assert last_high <= first_low


def test_invalid_request_gets_a_typed_failure(workers, redis_server, r):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        with pytest.raises(RequestFailed) as err:
            fleet.generate(prompt_token_ids=[10**6], max_tokens=4, timeout=30)
    assert err.value.code == "invalid_token_id"
    wait_until(lambda: r.xlen(STREAM_OF_DEFAULT) == 0, what="the entry acknowledged")
    assert r.xlen(keys.dead_letter_key("default")) == 0  # a rejection is not a dead letter
