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
OPEN = ("validating", "in_progress")  # the statuses a cancel, or the runner's end, moves a batch from

# A batch's status moves only along its lifecycle, atomically, so a cancel racing the
# runner can neither undo an ending nor be lost (KEYS: state; ARGV: new status, time,
# number of statuses it may leave, those statuses, then field/value pairs to set with it).
# Returns {1, the status left} or {0, the status found ('' for no batch)}.
MOVE = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {0, ''} end
local n = tonumber(ARGV[3])
for i = 4, 3 + n do
  if ARGV[i] == status then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2])
    for j = 4 + n, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1]) end
    return {1, status}
  end
end
return {0, status}
"""

# Record one answered line once: append it, count it, mark it done (KEYS: done, lines,
# state; ARGV: line number, line, counter, bytes field, ttl). A line answered twice (a
# runner that lost its lease) is not appended twice, and nothing is appended once the
# batch is finalizing or over: its published files and counts never change. Marked done
# last: a script stopped by an error (a refused command) leaves the line to be answered
# again, never lost.
RECORD = """
local status = redis.call('HGET', KEYS[3], 'status')
if status ~= 'in_progress' and status ~= 'cancelling' then return 0 end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('HINCRBY', KEYS[3], ARGV[4], string.len(ARGV[2]) + 1)
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""

# End a finalizing batch (KEYS: state, done, files index, active set, then each published
# file's meta key; ARGV: final status, time, published ids JSON, ttl, batch id, then per
# file its meta JSON, created_at and id). Returns 0, changing nothing, unless the batch is
# finalizing: only the runner that finalized it ends it, once.
FINISH = """
if redis.call('HGET', KEYS[1], 'status') ~= 'finalizing' then return 0 end
for i = 5, #KEYS do
  local a = 6 + 3 * (i - 5)
  redis.call('SET', KEYS[i], ARGV[a], 'EX', ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[a + 1], ARGV[a + 2])
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[1] .. '_at', ARGV[2], 'published', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SREM', KEYS[4], ARGV[5])
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
        self._move = redis.register_script(MOVE)
        self._finish = redis.register_script(FINISH)

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

    async def move(self, tenant: str, batch_id: str, status: str, leaving: tuple[str, ...],
                   **fields: Any) -> tuple[bool, str]:
        """Set the batch's ``status`` (and ``fields``) if it now is one of ``leaving``;
        returns whether it moved and the status it left or found ('' for no batch)."""
        args = [status, int(time.time()), len(leaving), *leaving]
        for name, value in fields.items():
            args += [name, value]
        moved, found = await self._move(keys=[keys.batch_key(tenant, batch_id)], args=args)
        return bool(moved), _text(found)

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
                     files: list[dict[str, Any]]) -> bool:
        """A finalizing batch ends as ``status``; its non-empty output/error ``files`` are
        published. False, changing nothing, if the batch is not finalizing."""
        args = [status, int(time.time()), json.dumps([m["id"] for m in files]), FILE_TTL_S,
                batch_id]
        for meta in files:
            args += [json.dumps(meta), meta["created_at"], meta["id"]]
        return bool(await self._finish(
            keys=[keys.batch_key(tenant, batch_id), keys.batch_key(tenant, batch_id, "done"),
                  keys.files_key(tenant), keys.active_batches_key(tenant),
                  *(keys.file_key(tenant, m["id"]) for m in files)],
            args=args))

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
