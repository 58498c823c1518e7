"""The producer against a real worker: async streaming and recovery, batch, status."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from redis_server import REPO, subprocess_env

from producer import AsyncFleetClient
from producer.status import collect
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]


def _fleet(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, check=check,
                          timeout=120)


def test_async_client_streams_and_a_late_watcher_recovers_from_progress(workers, redis_server):
    workers.start()

    async def scenario():
        async with AsyncFleetClient(redis_server.url) as fleet:
            stream = await fleet.submit(request_id="a-1", prompt_token_ids=PROMPT,
                                        max_tokens=25, ignore_eos=True, temperature=0.0)
            live = [t async for t in stream]
            result = await stream.result()
            late = await fleet.watch("a-1")  # after the fact: everything comes from storage
            replay = [t async for t in late]
            return live, replay, result, await late.result()

    live, replay, result, again = asyncio.run(scenario())
    assert [i for t in live for i in t.token_ids] == result.token_ids
    assert [i for t in replay for i in t.token_ids] == result.token_ids
    assert again == result


def test_batch_is_resumable_without_duplicating_lines(workers, redis_server, tmp_path):
    workers.start()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"prompt_token_ids": PROMPT, "max_tokens": 4 + i, "ignore_eos": True}
             for i in range(12)]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    partial = lines[:5]
    (tmp_path / "part.jsonl").write_text("".join(json.dumps(x) + "\n" for x in partial))
    _fleet("batch", "--redis-url", redis_server.url, str(tmp_path / "part.jsonl"), str(out))
    with out.open("a") as f:
        f.write('{"line": 6, "request_id": "torn')  # an interrupted write
    run = _fleet("batch", "--redis-url", redis_server.url, "--window", "4", str(src), str(out))
    assert "req/s" in run.stderr and "tok/s" in run.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["line"] for r in rows) == list(range(1, 13))
    assert all(len(r["result"]["token_ids"]) == 3 + r["line"] for r in rows)


def test_status_shows_backlog_and_workers(workers, redis_server, r):
    worker = workers.start()
    r.xadd(keys.stream_key("default", "default", "batch"), {"data": "{}"})  # a dead letter soon
    report = asyncio.run(collect(redis_server.url, "default"))
    assert report["workers"][worker.worker_id]["alive"]
    assert set(report["streams"]) == {"high", "default", "batch"}
    text = _fleet("status", "--redis-url", redis_server.url).stdout
    assert worker.worker_id in text and "dead letters" in text
