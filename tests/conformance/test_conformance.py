"""The same scenarios with the Python and the TypeScript clients, against a real worker on a
real redis-server: streaming equals the stored result, cancel, a lost subscription, a late
watcher, typed failures, what a client refuses before sending, and a tenant's ACL user.
Every message published or taken on the way is validated against the schema at the end."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import redis

from shared import keys, limits
from tests.conformance.harness import TS_DIR, maybe_node, schema_check

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
GREEDY = {"prompt_token_ids": PROMPT, "temperature": 0.0, "ignore_eos": True}
VOCAB = 49152  # the tiny model's (SmolLM2's tokenizer)


def stored(fleet, tenant: str, request_id: str) -> tuple[list[dict], dict | None]:
    progress = [json.loads(x) for x in fleet.r.lrange(keys.progress_key(tenant, request_id), 0, -1)]
    raw = fleet.r.hget(keys.state_key(tenant, request_id), "result")
    return progress, None if raw is None else json.loads(raw)


def check_seq_rule(events: list[dict]) -> list[int]:
    """Each event the client took starts where the previous ended: none lost, none repeated."""
    ids: list[int] = []
    for event in events:
        assert event["seq"] == len(ids), f"seq {event['seq']} after {len(ids)} tokens"
        ids.extend(event["token_ids"])
    return ids


def check_matches_store(fleet, run, tenant: str = "default") -> dict:
    result = run.result()
    progress, kept = stored(fleet, tenant, result["request_id"])
    assert kept == result
    assert check_seq_rule(run.events) == result["token_ids"] == check_seq_rule(progress)
    assert result["text"].startswith("".join(e["text"] for e in run.events))
    fleet.recorder.add(run.messages())
    return result


def test_streaming_equals_the_stored_result(fleet, clients):
    client = clients(fleet.url)
    runs = [client.stream({**GREEDY, "max_tokens": 40, "request_id": f"eq-{clients.kind}"}),
            client.stream({"messages": [{"role": "user", "content": "Tell me a story"}],
                           "max_tokens": 12, "temperature": 0.8, "seed": 7, "logprobs": 2,
                           "stop": ["\n\n"], "request_id": f"chat-{clients.kind}"})]
    greedy, chat = (check_matches_store(fleet, run) for run in runs)
    assert greedy["finish_reason"] == "length" and len(greedy["token_ids"]) == 40
    assert max(len(e["token_ids"]) for e in runs[0].events) > 1  # coalesced: several a message
    assert chat["finish_reason"] in ("length", "stop")
    assert all(len(e["logprobs"]) == len(e["token_ids"]) for e in runs[1].events)
    assert runs[0].request["tenant"] in (None, "default")
    # A stop token (greedy, so where it comes is known): finish reason stop, and which.
    stop_id = greedy["token_ids"][5]
    stopped = check_matches_store(fleet, client.stream(
        {**GREEDY, "max_tokens": 40, "stop_token_ids": [stop_id], "request_id": f"stop-{clients.kind}"}))
    assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", stop_id)
    assert greedy["token_ids"][:len(stopped["token_ids"])] == stopped["token_ids"]


def test_cancel_ends_the_request_with_the_tokens_so_far(fleet, clients):
    run = clients(fleet.url).stream({**GREEDY, "max_tokens": 3000, "request_id": f"cx-{clients.kind}"},
                                    cancel_after=3)
    result = check_matches_store(fleet, run)
    assert result["finish_reason"] == "cancelled"
    assert 3 <= len(result["token_ids"]) < 3000


def test_a_lost_subscription_is_recovered_from_the_stored_progress(fleet, clients):
    others = {c["id"] for c in fleet.r.client_list(_type="pubsub")}  # the worker's, the recorder's
    run = clients(fleet.url).stream({**GREEDY, "max_tokens": 400, "request_id": f"rc-{clients.kind}"})
    run.wait_tokens(20)
    victims = [c["id"] for c in fleet.r.client_list(_type="pubsub") if c["id"] not in others]
    assert victims  # the client's subscriber connection
    for client_id in victims:
        fleet.r.client_kill_filter(_id=client_id)
    result = check_matches_store(fleet, run)
    assert len(result["token_ids"]) == 400


def test_a_late_watcher_replays_the_stored_progress(fleet, clients):
    request_id = f"late-{clients.kind}"
    first = clients(fleet.url).stream({**GREEDY, "max_tokens": 25, "request_id": request_id})
    first.result()
    again = clients(fleet.url).watch(request_id)
    assert check_matches_store(fleet, again) == first.result()
    # Submitting the same id again generates nothing: the stored result comes back.
    same = clients(fleet.url).stream({**GREEDY, "max_tokens": 25, "request_id": request_id})
    assert same.result() == first.result()


def test_a_deadline_already_passed_times_out_with_no_tokens(fleet, clients):
    run = clients(fleet.url).stream({**GREEDY, "max_tokens": 8, "deadline": time.time() - 1,
                                     "request_id": f"late-dl-{clients.kind}"})
    result = check_matches_store(fleet, run)
    assert result["finish_reason"] == "timeout" and result["token_ids"] == []


def test_failures_are_typed(fleet, clients):
    client = clients(fleet.url)
    kind = clients.kind
    # The engine's validation: a token id outside the vocabulary.
    engine = client.stream({"prompt_token_ids": [VOCAB + 10], "max_tokens": 4,
                            "request_id": f"vocab-{kind}"})
    # A payload no client sends (max_tokens 0), written by hand, then watched.
    bad_id = f"mal-{kind}"
    malformed = client.watch(bad_id)
    fleet.r.xadd(keys.stream_key("default", "default", "default"), {
        keys.STREAM_FIELD: json.dumps({"request_id": bad_id, "prompt": "x", "max_tokens": 0})})
    # A payload naming another tenant than its stream's.
    other_id = f"other-{kind}"
    mismatch = client.watch(other_id)
    fleet.r.xadd(keys.stream_key("default", "default", "default"), {
        keys.STREAM_FIELD: json.dumps({"request_id": other_id, "tenant": "acme", "prompt": "x"})})
    for run, code in ((engine, "invalid_token_id"), (malformed, "malformed"),
                      (mismatch, "tenant_mismatch")):
        final = run.wait()
        assert final.get("failure", {}).get("code") == code, final
        assert run.events == []
        fleet.recorder.add(run.messages())
    _, kept = stored(fleet, "default", other_id)
    assert kept["code"] == "tenant_mismatch"
    assert fleet.r.hget(keys.state_key("acme", other_id), "result") is None  # acme's keys untouched


def test_what_a_worker_would_refuse_unread_is_refused_before_sending(fleet, clients, tmp_path):
    client = clients(fleet.url)
    stream = keys.stream_key("default", "default", "default")
    before = fleet.r.xlen(stream)
    big = {"request_id": f"big-{clients.kind}", "max_tokens": 4,
           "messages": [{"role": "user", "content": "x" * limits.MAX_MESSAGE_CHARS}] * 6}
    if clients.kind == "typescript":  # over the size of one command-line argument
        (tmp_path / "big.json").write_text(json.dumps(big))
        final = client._start(["stream", "--request", f"@{tmp_path / 'big.json'}"]).wait()
    else:
        final = client.stream(big).wait()
    assert final["error"]["error"] == "PayloadTooLarge", final
    assert fleet.r.xlen(stream) == before


def test_a_tenant_acl_user_streams_and_cancels(fleet, clients):
    """acme's own ACL user (shared.tenants.acl_user): enqueue on its streams, read its keys,
    cancel (the key; the notice is refused by the ACL, and the clients go on without it)."""
    client = clients(fleet.tenant_url(), tenant="acme")
    done = client.stream({**GREEDY, "max_tokens": 10, "request_id": f"acme-{clients.kind}"})
    cancelled = client.stream({**GREEDY, "max_tokens": 3000, "request_id": f"acme-cx-{clients.kind}"},
                              cancel_after=2)
    assert check_matches_store(fleet, done, tenant="acme")["finish_reason"] == "length"
    assert check_matches_store(fleet, cancelled, tenant="acme")["finish_reason"] == "cancelled"
    acme = redis.Redis.from_url(fleet.tenant_url())
    with pytest.raises(redis.exceptions.NoPermissionError):
        acme.publish(keys.control_channel("default"), b"{}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        acme.xadd(keys.stream_key("default", "acme", "batch"), {keys.STREAM_FIELD: b"{}"})
    acme.close()


def test_the_typescript_batch_helper_keeps_input_order(fleet, node_client, tmp_path):
    """Six requests, three at a time, one failing: outcomes in input order, each equal to
    the stored result."""
    lines = [{**GREEDY, "max_tokens": 5 + i, "request_id": f"batch-{i}"} for i in range(6)]
    lines[3] = {"prompt_token_ids": [VOCAB + 1], "request_id": "batch-3"}
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = subprocess.run([node_client.node, node_client.cli, "batch", str(tmp_path / "in.jsonl"),
                           "--concurrency", "3", "--url", fleet.url], check=False,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr  # one failed
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["request_id"] for o in out] == [f"batch-{i}" for i in range(6)]
    assert out[3]["code"] == "invalid_token_id" and out[3]["error"] == "RequestFailed"
    for i in (0, 1, 2, 4, 5):
        assert out[i]["result"] == stored(fleet, "default", f"batch-{i}")[1]
        assert len(out[i]["result"]["token_ids"]) == 5 + i


def test_the_readme_program_streams_an_answer(fleet, node_client):
    """The program in producer/typescript/README.md is examples/stream.ts, under 30 lines,
    and streams an answer from the worker."""
    readme = (TS_DIR / "README.md").read_text()
    program = (TS_DIR / "examples" / "stream.ts").read_text()
    assert f"```ts\n{program}```" in readme
    assert len(program.splitlines()) < 30
    proc = subprocess.run([node_client.node, str(TS_DIR / "dist" / "examples" / "stream.js")],
                          check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REDIS_URL": fleet.url})
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\n\[(stop|length), \d+ tokens\]\n$", proc.stdout), proc.stdout


def test_everything_recorded_is_valid_against_the_schema(fleet, request, tmp_path):
    """Runs last in this module: every message the worker published and every request and
    event the clients sent and took, for jsonschema and (where built) Ajv."""
    messages = fleet.recorder.messages
    if len(messages) < 50:
        pytest.skip("validates what the other tests of this module recorded: run them with it")
    kinds = {m.get("type", "request") for m in messages}
    assert {"token", "result", "failure", "request"} <= kinds, kinds
    assert {m["finish_reason"] for m in messages if m.get("type") == "result"} >= {
        "length", "cancelled", "timeout"}
    schema_check(messages, maybe_node(request), tmp_path)
