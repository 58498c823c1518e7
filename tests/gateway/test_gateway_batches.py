"""``/v1/files`` + ``/v1/batches`` with the official ``openai`` client, against the real
gateway, a real worker (the tiny random model) and a real Redis: the whole workflow, a
gateway restart mid-batch, cancel, and the refusals."""
from __future__ import annotations

import contextlib
import io
import json
import time

import pytest
from fleet_harness import WorkerFactory
from gateway_harness import register_tenants, start_gateway
from redis_server import RedisServer, free_port

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
KEYS = {"sk-acme": "acme", "sk-globex": "globex"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model):
    server = RedisServer().start()
    register_tenants(server.url, "acme", "globex")
    tmp = tmp_path_factory.mktemp("batches")
    factory = WorkerFactory(server, tiny_model, tmp)
    factory.start(max_num_seqs=2)
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps({"keys": KEYS}))
    port = free_port()

    def gateway():
        return start_gateway(server.url, tmp / f"gateway-{time.monotonic()}.log", port,
                             "--served-model", "tiny=default", "--api-keys", str(keys_file))

    yield server, gateway, factory
    factory.cleanup()
    server.stop()


def _client(url: str, key: str = "sk-acme"):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


@contextlib.contextmanager
def _serving(fleet):
    gateway = fleet[1]()
    try:
        yield gateway, _client(gateway.url)
    finally:
        gateway.stop()


def _lines(n: int, max_tokens: int = 4) -> list[dict]:
    out = []
    for i in range(n):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"line {i}"}],
                "max_tokens": max_tokens + i % 3, "ignore_eos": True, "temperature": 0}
        out.append({"custom_id": f"task-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": body})
    return out


def _upload(client, rows) -> str:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def _wait(client, batch_id: str, until=("completed", "failed", "cancelled", "expired"),
          timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch) if callable(until) else batch.status in until:
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def _content(client, file_id) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_files_and_batches_workflow_with_the_openai_client(fleet):
    with _serving(fleet) as (gateway, client):
        rows = _lines(6)
        rows.append({"custom_id": "wrong-url", "method": "POST", "url": "/v1/completions",
                     "body": {"model": "tiny", "prompt": PROMPT, "max_tokens": 2}})
        rows.append({"custom_id": "no-model", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}})
        file_id = _upload(client, rows)
        assert client.files.retrieve(file_id).purpose == "batch"
        assert file_id in [f.id for f in client.files.list()]
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                      completion_window="24h", metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
        batch = _wait(client, batch.id)
        assert batch.status == "completed", batch
        assert batch.request_counts.total == 8
        assert (batch.request_counts.completed, batch.request_counts.failed) == (6, 2)
        assert batch.completed_at and batch.in_progress_at and batch.output_file_id
        output = _content(client, batch.output_file_id)
        assert sorted(x["custom_id"] for x in output) == sorted(r["custom_id"] for r in rows[:6])
        by_id = {r["custom_id"]: r for r in rows}
        for line in output:
            body = line["response"]["body"]
            assert line["response"]["status_code"] == 200 and line["error"] is None
            assert body["object"] == "chat.completion"
            assert body["usage"]["completion_tokens"] == by_id[line["custom_id"]]["body"]["max_tokens"]
        errors = {x["custom_id"]: x for x in _content(client, batch.error_file_id)}
        assert set(errors) == {"wrong-url", "no-model"}
        assert errors["wrong-url"]["response"]["status_code"] == 400
        assert errors["no-model"]["response"]["body"]["error"]["code"] == "model_not_found"
        assert batch.id in [b.id for b in client.batches.list()]
        # another tenant sees none of it
        other = _client(gateway.url, "sk-globex")
        from openai import NotFoundError

        with pytest.raises(NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(NotFoundError):
            other.files.content(batch.output_file_id)
        assert client.files.delete(file_id).deleted
        with pytest.raises(NotFoundError):
            client.files.retrieve(file_id)


def test_a_batch_survives_a_gateway_crash(fleet):
    rows = _lines(16, max_tokens=60)
    with _serving(fleet) as (gateway, client):
        batch = client.batches.create(input_file_id=_upload(client, rows),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 2)
        gateway.proc.kill()  # a crash mid-batch: its lease runs out (15 s), nothing is released
        gateway.proc.wait(10)
    # a new gateway process on the same Redis takes the batch over
    with _serving(fleet) as (gateway, client):
        mid = client.batches.retrieve(batch.id)
        assert mid.status == "in_progress" and mid.request_counts.completed < 16, mid
        done = _wait(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 16, done
        assert done.request_counts.failed == 0
        output = _content(client, done.output_file_id)
        assert sorted(x["custom_id"] for x in output) == sorted(r["custom_id"] for r in rows)


def test_cancel_stops_the_batch_and_keeps_what_finished(fleet):
    with _serving(fleet) as (gateway, client):
        rows = _lines(40, max_tokens=40)
        batch = client.batches.create(input_file_id=_upload(client, rows),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        _wait(client, batch.id, until=lambda b: b.request_counts.completed >= 1)
        assert client.batches.cancel(batch.id).status == "cancelling"
        done = _wait(client, batch.id, until=("cancelled",))
        assert done.cancelled_at and done.request_counts.completed < 40
        output = _content(client, done.output_file_id)
        ids = [x["custom_id"] for x in output]
        assert len(ids) == len(set(ids)) == done.request_counts.completed
        from openai import ConflictError

        with pytest.raises(ConflictError):
            client.batches.cancel(batch.id)


def test_refusals_are_openai_errors(fleet):
    import httpx
    from openai import BadRequestError, NotFoundError

    with _serving(fleet) as (gateway, client):
        with pytest.raises(NotFoundError):
            client.batches.create(input_file_id="file-" + "0" * 32,
                                  endpoint="/v1/chat/completions", completion_window="24h")
        file_id = _upload(client, _lines(1))
        with pytest.raises(BadRequestError):
            client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h")
        with pytest.raises(BadRequestError):
            client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
        r = httpx.get(gateway.url + "/v1/batches/../../etc", headers={
            "authorization": "Bearer sk-acme"})
        assert r.status_code == 404 and set(r.json()["error"]) >= {"message", "code"}
        assert httpx.get(gateway.url + "/v1/files").status_code == 401


def test_a_batch_past_its_window_expires_with_error_lines(fleet):
    import asyncio

    from producer.gateway.batch_store import Store, new_id
    from shared import connect

    server = fleet[0]
    rows = _lines(3)
    now = int(time.time())
    meta = {"id": new_id("file"), "object": "file", "created_at": now, "purpose": "batch"}
    fixed = {"id": new_id("batch"), "endpoint": "/v1/chat/completions", "created_at": now - 7200,
             "input_file_id": meta["id"], "completion_window": "1h", "expires_at": now - 3600,
             "output_file_id": new_id("file"), "error_file_id": new_id("file"),
             "metadata": None}

    async def put():  # as a gateway that died an hour ago left it
        redis = await connect.async_client(server.url)
        store = Store(redis)
        await store.put_file("acme", meta, [json.dumps(r).encode() for r in rows], 3600)
        await store.put_batch("acme", fixed)
        await redis.aclose()

    asyncio.run(put())
    with _serving(fleet) as (gateway, client):
        batch = _wait(client, fixed["id"])
        assert batch.status == "expired" and batch.expired_at, batch
        assert batch.request_counts.failed == 3 and batch.output_file_id is None
        errors = _content(client, batch.error_file_id)
        assert sorted(x["custom_id"] for x in errors) == [r["custom_id"] for r in rows]
        assert all(x["error"]["code"] == "batch_expired" and x["response"] is None
                   for x in errors)
