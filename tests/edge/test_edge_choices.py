"""n > 1 through a real worker on a real redis-server: choices streamed == stored, a worker
killed mid-generation resumes every choice; a reused id with a different request gets
``id_conflict`` and the original's answer stays untouched."""
from __future__ import annotations

import signal

import pytest
from redis_server import wait_until

from producer import FleetClient
from producer.errors import IdConflict
from shared import codec, keys
from shared.protocol import Request

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42] * 3
SAMPLED = dict(prompt_token_ids=PROMPT, temperature=1.0, ignore_eos=True, seed=11)


def _by_choice(tokens) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for t in tokens:
        assert t.seq == len(out.get(t.index, [])), "seq rule broken within a choice"
        out.setdefault(t.index, []).extend(t.token_ids)
    return out


def test_three_choices_stream_exactly_their_stored_result(workers, redis_server, r):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(request_id="three", n=3, max_tokens=40, **SAMPLED)
        streamed = _by_choice(list(stream))
        result = stream.result(timeout=60)
        again = fleet.generate(request_id="three-again", n=3, max_tokens=40, timeout=60, **SAMPLED)
        single = fleet.generate(request_id="one", max_tokens=40, timeout=60, **SAMPLED)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert streamed == {c.index: c.token_ids for c in result.choices}
    assert len({tuple(c.token_ids) for c in result.choices}) == 3          # differ under sampling
    assert [c.token_ids for c in again.choices] == [c.token_ids for c in result.choices]  # seed
    assert result.token_ids == result.choices[0].token_ids == single.token_ids  # n=1 unchanged
    assert single.choices is None
    assert result.usage.completion_tokens == 120
    stored = codec.decode_terminal(r.hget(keys.state_key("default", "three"), "result"))
    assert stored == result


def test_sigkill_mid_generation_resumes_every_choice(workers, redis_server, r):
    procs = {w.worker_id: w for w in (workers.start(), workers.start())}
    with FleetClient(redis_server.url) as fleet:
        reference = fleet.generate(request_id="ref", n=3, max_tokens=400, timeout=90, **SAMPLED)
        stream = fleet.submit(request_id="victim", n=3, max_tokens=400, **SAMPLED)
        tokens = []
        for token in stream:
            tokens.append(token)
            if sum(len(t.token_ids) for t in tokens) >= 60:
                break
        owner = r.hget(keys.state_key("default", "victim"), "owner").decode().split("#")[0]
        procs[owner].signal(signal.SIGKILL)
        tokens += list(stream)
        result = stream.result(timeout=90)
    assert result.worker_id != owner and result.num_resumes == 1
    # Seeded sampling is a function of (seed, position): resumed choices are as if uninterrupted.
    assert _by_choice(tokens) == {c.index: c.token_ids for c in reference.choices}
    assert [c.token_ids for c in result.choices] == [c.token_ids for c in reference.choices]


@pytest.mark.parametrize("n", [1, 2])
def test_a_reused_id_with_another_request_is_an_id_conflict(workers, redis_server, r, n):
    workers.start()
    state = keys.state_key("default", "job-1")
    with FleetClient(redis_server.url) as fleet:
        original = fleet.generate(request_id="job-1", n=n, max_tokens=8, timeout=60, **SAMPLED)
        stored = r.hget(state, "result")
        # Through the client: refused before anything is sent.
        with pytest.raises(IdConflict) as caught:
            fleet.generate(request_id="job-1", n=n, max_tokens=9, timeout=60, **SAMPLED)
        assert caught.value.code == "id_conflict"
        # The same request again (a retry with a new deadline and metadata) is no conflict.
        retry = fleet.generate(request_id="job-1", n=n, max_tokens=8, timeout=60,
                               deadline=4e9, metadata={"try": "2"}, **SAMPLED)
        assert retry == original
        # Raw, past the client's check: the worker stores the failure for that entry alone.
        other = Request(request_id="job-1", prompt="something else", max_tokens=8)
        entry_id = r.xadd(keys.stream_key("default", "default", "default"),
                          {keys.STREAM_FIELD: codec.encode(other)}).decode()
        field = f"conflict:{keys.stream_key('default', 'default', 'default')}|{entry_id}"
        wait_until(lambda: r.hget(state, field) is not None, timeout=30, what="the conflict stored")
        failure = codec.decode_terminal(r.hget(state, field))
        assert failure.code == "id_conflict" and failure.request_id == "job-1"
        assert r.hget(state, "result") == stored                    # the original, untouched
        assert fleet.get_result("job-1") == original
    wait_until(lambda: r.xpending(keys.stream_key("default", "default", "default"),
                                  keys.GROUP)["pending"] == 0, timeout=10, what="acknowledged")


def test_two_different_requests_queued_under_one_id_one_wins_the_other_conflicts(workers, redis_server):
    with FleetClient(redis_server.url) as fleet:
        first = fleet.submit(request_id="race", max_tokens=6, **SAMPLED)
        second = fleet.submit(request_id="race", max_tokens=7, **SAMPLED)   # both queued, none begun
        workers.start()
        assert len(first.result(timeout=60).token_ids) == 6
        with pytest.raises(IdConflict):
            list(second)
            second.result(timeout=60)


def test_a_choice_ended_before_a_kill_stays_ended_and_the_others_resume(workers, redis_server, r):
    procs = {w.worker_id: w for w in (workers.start(), workers.start())}
    long = dict(SAMPLED, max_tokens=1500)
    with FleetClient(redis_server.url) as fleet:
        probe = [c.token_ids for c in fleet.generate(request_id="probe", n=3, timeout=120, **long).choices]
        # A token early in choice 1 that choices 0 and 2 never sample: a stop for choice 1 alone.
        stop = next((t for t in probe[1][2:40] if t not in probe[0] and t not in probe[2]), None)
        if stop is None:
            pytest.skip("no token separates the choices of this seed")
        reference = fleet.generate(request_id="ref", n=3, stop_token_ids=[stop], timeout=120, **long)
        assert reference.choices[1].finish_reason == "stop" and len(reference.choices[0].token_ids) == 1500
        stream = fleet.submit(request_id="victim", n=3, stop_token_ids=[stop], **long)
        state = keys.state_key("default", "victim")
        wait_until(lambda: r.hexists(state, "choice:1"), timeout=60, what="choice 1 ended and stored")
        owner = r.hget(state, "owner").decode().split("#")[0]
        procs[owner].signal(signal.SIGKILL)
        tokens = list(stream)
        result = stream.result(timeout=120)
    assert result.worker_id != owner and result.num_resumes == 1
    assert result.choices == reference.choices
    assert _by_choice(tokens) == {c.index: c.token_ids for c in reference.choices}
