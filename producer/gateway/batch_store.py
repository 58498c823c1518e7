"""Files and batches in Redis, under each tenant's hash tag (``shared.keys``).

A file is its object JSON (``meta``) and its lines (a list, read in chunks: a big file is
never in memory whole); both expire. A batch is a hash (status, counts, times and its
fixed fields), the set of input line numbers answered, and a lease; its output and error
files are filled line by line while it runs and published when it ends.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from shared import keys

FILE_TTL_S = 30 * 86400  # files, and finished batches, are kept 30 days (OpenAI's default)
CHUNK = 500  # lines per LRANGE / RPUSH
TIMES = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
         "cancelled")
FINAL = {"completed", "failed", "expired", "cancelled"}

# Record one answered line once: append it, count it, mark it done (KEYS: done, lines,
# state; ARGV: line number, line, counter, bytes field, ttl). A line answered twice (a
# runner that lost its lease) is not appended twice. Marked done last: a script stopped
# by an error (a refused command) leaves the line to be answered again, never lost.
RECORD = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('HINCRBY', KEYS[3], ARGV[4], string.len(ARGV[2]) + 1)
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def new_id(kind: str) -> str:
    return ("file-" if kind == "file" else "batch_") + uuid.uuid4().hex


def valid_id(object_id: str, kind: str) -> bool:
    prefix = "file-" if kind == "file" else "batch_"
    rest = object_id[len(prefix):]
    return object_id.startswith(prefix) and len(rest) == 32 and rest.isalnum() and rest.isascii()


class Store:
    def __init__(self, redis) -> None:
        self.redis = redis
        self._record = redis.register_script(RECORD)

    # ---- files
    async def put_file(self, tenant: str, meta: dict[str, Any], lines: list[bytes],
                       ttl_s: int) -> dict[str, Any]:
        file_id = meta["id"]
        pipe = self.redis.pipeline(transaction=True)
        for i in range(0, len(lines), CHUNK):
            pipe.rpush(keys.file_key(tenant, file_id, "lines"), *lines[i:i + CHUNK])
        pipe.expire(keys.file_key(tenant, file_id, "lines"), ttl_s)
        pipe.set(keys.file_key(tenant, file_id), json.dumps(meta), ex=ttl_s)
        pipe.zadd(keys.files_key(tenant), {file_id: meta["created_at"]})
        await pipe.execute()
        return meta

    async def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        raw = await self.redis.get(keys.file_key(tenant, file_id))
        return None if raw is None else json.loads(raw)

    async def files(self, tenant: str) -> list[dict[str, Any]]:
        """Every file the tenant still has, oldest first (expired ones forgotten)."""
        ids = [_text(i) for i in await self.redis.zrange(keys.files_key(tenant), 0, -1)]
        metas = await self.redis.mget([keys.file_key(tenant, i) for i in ids]) if ids else []
        gone = [i for i, m in zip(ids, metas) if m is None]
        if gone:
            await self.redis.zrem(keys.files_key(tenant), *gone)
        return [json.loads(m) for m in metas if m is not None]

    async def lines(self, tenant: str, file_id: str, start: int = 0) -> AsyncIterator[list[bytes]]:
        key = keys.file_key(tenant, file_id, "lines")
        while True:
            chunk = await self.redis.lrange(key, start, start + CHUNK - 1)
            if not chunk:
                return
            yield chunk
            start += len(chunk)

    async def line_count(self, tenant: str, file_id: str) -> int:
        return await self.redis.llen(keys.file_key(tenant, file_id, "lines"))

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.file_key(tenant, file_id), keys.file_key(tenant, file_id, "lines"))
        pipe.zrem(keys.files_key(tenant), file_id)
        return bool((await pipe.execute())[0])

    # ---- batches
    async def put_batch(self, tenant: str, fixed: dict[str, Any]) -> None:
        batch_id = fixed["id"]
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.batch_key(tenant, batch_id), mapping={
            "fixed": json.dumps(fixed), "status": "validating", "total": 0, "completed": 0,
            "failed": 0})
        pipe.zadd(keys.batches_key(tenant), {batch_id: fixed["created_at"]})
        pipe.sadd(keys.active_batches_key(tenant), batch_id)
        await pipe.execute()

    async def batch(self, tenant: str, batch_id: str) -> dict[str, str] | None:
        raw = await self.redis.hgetall(keys.batch_key(tenant, batch_id))
        return {_text(k): _text(v) for k, v in raw.items()} or None

    async def batch_ids(self, tenant: str) -> list[str]:
        """Newest first."""
        return [_text(i) for i in await self.redis.zrevrange(keys.batches_key(tenant), 0, -1)]

    async def active(self, tenant: str) -> list[str]:
        return sorted(_text(i) for i in await self.redis.smembers(keys.active_batches_key(tenant)))

    async def set_status(self, tenant: str, batch_id: str, status: str, **fields: Any) -> None:
        mapping = {"status": status, f"{status}_at": int(time.time()), **fields}
        await self.redis.hset(keys.batch_key(tenant, batch_id), mapping=mapping)

    async def done(self, tenant: str, batch_id: str) -> set[int]:
        return {int(x) for x in await self.redis.smembers(keys.batch_key(tenant, batch_id, "done"))}

    async def record(self, tenant: str, batch: dict[str, Any], number: int, line: str,
                     ok: bool) -> bool:
        file_id = batch["output_file_id"] if ok else batch["error_file_id"]
        counter, size = ("completed", "output_bytes") if ok else ("failed", "error_bytes")
        return bool(await self._record(
            keys=[keys.batch_key(tenant, batch["id"], "done"),
                  keys.file_key(tenant, file_id, "lines"), keys.batch_key(tenant, batch["id"])],
            args=[number, line, counter, size, FILE_TTL_S]))

    async def finish(self, tenant: str, batch_id: str, status: str,
                     files: list[dict[str, Any]]) -> None:
        """The batch ends as ``status``; its non-empty output/error ``files`` are published."""
        pipe = self.redis.pipeline(transaction=True)
        for meta in files:
            pipe.set(keys.file_key(tenant, meta["id"]), json.dumps(meta), ex=FILE_TTL_S)
            pipe.zadd(keys.files_key(tenant), {meta["id"]: meta["created_at"]})
        pipe.hset(keys.batch_key(tenant, batch_id),
                  mapping={"status": status, f"{status}_at": int(time.time()),
                           "published": json.dumps([m["id"] for m in files])})
        for part in ("state", "done"):
            pipe.expire(keys.batch_key(tenant, batch_id, part), FILE_TTL_S)
        pipe.srem(keys.active_batches_key(tenant), batch_id)
        await pipe.execute()

    async def lease(self, tenant: str, batch_id: str, owner: str, ttl_s: float) -> bool:
        """Take or renew the batch's lease; False while another runner holds it."""
        key = keys.batch_key(tenant, batch_id, "lease")
        if await self.redis.set(key, owner, nx=True, px=int(ttl_s * 1000)):
            return True
        if _text(await self.redis.get(key)) == owner:
            await self.redis.pexpire(key, int(ttl_s * 1000))
            return True
        return False

    async def release(self, tenant: str, batch_id: str, owner: str) -> None:
        key = keys.batch_key(tenant, batch_id, "lease")
        if _text(await self.redis.get(key)) == owner:
            await self.redis.delete(key)


def render(state: dict[str, str]) -> dict[str, Any]:
    """The OpenAI Batch object of a stored batch."""
    fixed = json.loads(state["fixed"])
    published = set(json.loads(state.get("published", "[]")))
    obj = {"id": fixed["id"], "object": "batch", "endpoint": fixed["endpoint"],
           "errors": json.loads(state["errors"]) if state.get("errors") else None,
           "input_file_id": fixed["input_file_id"],
           "completion_window": fixed["completion_window"], "status": state["status"],
           "output_file_id": fixed["output_file_id"] if fixed["output_file_id"] in published
           else None,
           "error_file_id": fixed["error_file_id"] if fixed["error_file_id"] in published
           else None,
           "created_at": fixed["created_at"], "expires_at": fixed["expires_at"],
           "request_counts": {k: int(state.get(k, 0)) for k in ("total", "completed", "failed")},
           "metadata": fixed.get("metadata")}
    for name in TIMES:
        value = state.get(f"{name}_at")
        obj[f"{name}_at"] = int(value) if value else None
    return obj
