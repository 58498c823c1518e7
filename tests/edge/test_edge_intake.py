"""Intake: admission by free KV blocks, bad entries, slow subscribers, a raw-RESP client."""
from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

from redis_server import wait_until

from producer import FleetClient, RequestFailed
from shared import keys, limits

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
STREAM = keys.stream_key("default", "default", "default")


def test_worker_holds_only_what_its_kv_blocks_admit(workers, redis_server, r):
    # tiny model: 2 layers x 2 KV heads x 16 dims x 2 (K,V) x 4 B = 512 B/token; 8 KiB/block.
    # 64 KiB = 8 blocks; each request needs 8 + 56 = 64 tokens = 4 blocks -> N = 2 fit.
    n_fit, local_queue = 2, 1
    total = 4 * n_fit * 2
    with FleetClient(redis_server.url) as fleet:
        streams = [fleet.submit(prompt_token_ids=PROMPT, max_tokens=56, ignore_eos=True)
                   for _ in range(total)]
        workers.start(kv_cache_memory="64KiB", local_queue=local_queue)
        held, lags = [], []
        while any(fleet.get_result(s.request_id) is None for s in streams):
            held.append(r.xpending(STREAM, keys.GROUP)["pending"])
            lags.append(r.xlen(STREAM) - held[-1])
            time.sleep(0.005)
        results = [s.result(timeout=60) for s in streams]
    assert all(len(x.token_ids) == 56 for x in results)
    assert max(held) <= n_fit + local_queue, held
    assert max(held) >= n_fit  # it did use what fits
    assert max(lags) >= total - n_fit - local_queue  # the rest waited in the stream, as lag


def test_bad_entries_are_dead_lettered_at_once_and_the_worker_keeps_serving(workers, redis_server, r):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        r.xadd(STREAM, {"data": "not json"})
        r.xadd(STREAM, {"other": "no data field"})
        r.xadd(STREAM, {"data": "x" * (limits.MAX_PAYLOAD_BYTES + 1)})
        stream_v = _raw_submit(fleet, r, {"v": 99, "request_id": "ver", "prompt": "hi"})
        stream_m = _raw_submit(fleet, r, {"request_id": "mal", "max_tokens": 3})
        for stream, code in ((stream_v, "unsupported_version"), (stream_m, "malformed")):
            try:
                stream.result(timeout=30)
                raise AssertionError("expected a failure")
            except RequestFailed as exc:
                assert exc.code == code
        assert fleet.generate(prompt_token_ids=PROMPT, max_tokens=3, timeout=30).token_ids
    dead = r.xrange(keys.dead_letter_key("default"))
    assert sorted(d[1][b"code"].decode() for d in dead) == sorted(
        ["malformed", "malformed", "too_large", "unsupported_version", "malformed"])
    wait_until(lambda: r.xlen(STREAM) == 0 and r.xpending(STREAM, keys.GROUP)["pending"] == 0,
               timeout=10, what="every entry acknowledged and deleted")


def _raw_submit(fleet, r, payload: dict):
    """Watch through the client, but enqueue a payload the client would refuse."""
    stream = fleet.watch(payload["request_id"])
    r.xadd(STREAM, {"data": json.dumps(payload)})
    return stream


def test_a_subscriber_that_never_reads_does_not_stall_the_worker(workers, redis_server, r):
    workers.start()
    r.config_set("client-output-buffer-limit", "pubsub 64kb 32kb 1")
    stuck = socket.create_connection(("127.0.0.1", redis_server.port))
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    channel = keys.channel("default", "flood").encode()
    stuck.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(channel), channel))
    with FleetClient(redis_server.url) as fleet:
        flood = fleet.submit(request_id="flood", prompt_token_ids=PROMPT, max_tokens=1500,
                             ignore_eos=True, logprobs=20)
        t0 = time.monotonic()
        other = fleet.generate(prompt_token_ids=PROMPT, max_tokens=20, timeout=30)
        assert time.monotonic() - t0 < 10 and len(other.token_ids) == 20
        assert len(flood.result(timeout=120).token_ids) == 1500
    stuck.close()


def test_a_non_python_client_with_raw_redis_commands(workers, redis_server):
    """Follows docs/protocol.md with redis-cli only: register the tenant, subscribe, XADD
    to the tenant's own stream, read events/result."""
    cli = ["redis-cli", "-p", str(redis_server.port)]
    subprocess.run(cli + ["HSET", keys.tenants_key(), "acme", '{"name":"acme"}'], check=True,
                   capture_output=True)
    workers.start()
    channel = "fleet:req:{acme/raw-1}:events"
    sub = subprocess.Popen(cli + ["SUBSCRIBE", channel], stdout=subprocess.PIPE, text=True)
    assert sub.stdout.readline().strip() == "subscribe"  # confirmed before we submit
    request = json.dumps({"request_id": "raw-1", "tenant": "acme", "prompt": "Hello",
                          "max_tokens": 5, "temperature": 0})
    subprocess.run(cli + ["XADD", "fleet:default:requests:{acme}:default", "*", "data", request],
                   check=True, capture_output=True)
    lines: list[str] = []
    threading.Timer(60, sub.kill).start()
    while not any('"type":"result"' in line for line in lines):
        lines.append(sub.stdout.readline())
        assert lines[-1], "the subscription ended before the result"
    sub.kill()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    tokens = [e for e in events if e["type"] == "token"]
    assert [e["seq"] for e in tokens] == list(range(5))
    stored = subprocess.run(cli + ["HGET", "fleet:req:{acme/raw-1}:state", "result"],
                            check=True, capture_output=True, text=True).stdout
    result = json.loads(stored)
    assert result["finish_reason"] == "length"
    assert result["token_ids"] == [i for e in tokens for i in e["token_ids"]]
    progress = subprocess.run(cli + ["LRANGE", "fleet:req:{acme/raw-1}:progress", "0", "-1"],
                              check=True, capture_output=True, text=True).stdout.split("\n")
    assert len([p for p in progress if p.startswith("{")]) == 5
    wait_until(lambda: True)
