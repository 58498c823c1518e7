"""The worker's background duties: lease renewal, cancel notices, heartbeats."""
from __future__ import annotations

import asyncio
import logging
import time

from gpu_worker.edge import calls
from gpu_worker.edge.inflight import engine_key
from gpu_worker.edge.redis_io import Backoff
from gpu_worker.edge.state import WorkerState
from shared import codec, keys

logger = logging.getLogger(__name__)


async def renew_leases(state: WorkerState) -> None:
    """Keep this worker's pending entries fresh, so XAUTOCLAIM never takes a live worker's
    request; learn of entries another worker took over (fenced) and of cancel keys missed
    on the control channel."""
    held = list(state.inflight.values())
    if not held:
        return
    renewals = calls.renew(state.options, [inf.entry for inf in held])
    checks = [("EXISTS", inf.redis_keys[2]) for inf in held]
    results = await state.io.run(renewals + checks)
    for result in results:
        if isinstance(result, Exception):
            raise result
    for lost_ids in results[:len(renewals)]:
        lost = {i.decode() if isinstance(i, bytes) else i for i in lost_ids}
        for inf in held:
            if inf.entry.entry_id in lost:
                state.lose(inf.key, "lease taken over")
    for inf, exists in zip(held, results[len(renewals):]):
        if exists:
            state.cancel(inf.key)


async def lease_loop(state: WorkerState) -> None:
    backoff = Backoff()
    while True:
        await asyncio.sleep(state.options.renew_interval_s)
        try:
            await renew_leases(state)
            backoff.reset()
        except Exception as exc:  # noqa: BLE001 - the next renewal tries again
            state.redis.on_error(exc, "renewing leases")


async def heartbeat_once(state: WorkerState) -> None:
    opts = state.options
    key = keys.worker_key(opts.model_name, opts.worker_id)
    now = time.time()
    mapping = {**state.status(), "last_seen": now, "lanes": ",".join(opts.lanes)}
    ttl_ms = int(opts.heartbeat_s * 3000)
    await state.io.run([("HSET", key, *[x for kv in mapping.items() for x in kv]),
                        ("PEXPIRE", key, ttl_ms),
                        ("ZADD", keys.workers_key(opts.model_name), now, opts.worker_id)])


async def heartbeat_loop(state: WorkerState) -> None:
    while True:
        try:
            await heartbeat_once(state)
            state.redis.on_ok(wrote=True)
        except Exception as exc:  # noqa: BLE001 - the next beat tries again
            state.redis.on_error(exc, "writing the heartbeat")
        await asyncio.sleep(state.options.heartbeat_s)


async def remove_heartbeat(state: WorkerState) -> None:
    opts = state.options
    await state.io.run([("DEL", keys.worker_key(opts.model_name, opts.worker_id)),
                        ("ZREM", keys.workers_key(opts.model_name), opts.worker_id)])


async def control_loop(state: WorkerState) -> None:
    """Cancel notices. At-most-once: the cancel key, checked on every progress write and
    lease renewal, is what makes cancellation certain; this only makes it quick."""
    backoff = Backoff()
    channel = keys.control_channel(state.options.model_name)
    while True:
        pubsub = state.io.client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            backoff.reset()
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                try:
                    notice = codec.decode_cancel(message["data"])
                except Exception:  # noqa: BLE001 - anyone may publish anything here
                    logger.warning("ignoring a malformed control message")
                    continue
                # A notice is only a hint: act on it only if the request's own cancel key
                # (which a tenant can write only under its own hash tag) says so.
                if await state.io.client.exists(keys.cancel_key(notice.tenant, notice.request_id)):
                    state.cancel(engine_key(notice.tenant, notice.request_id))
        except Exception as exc:  # noqa: BLE001 - resubscribe, whatever the cause
            state.redis.on_error(exc, "listening for cancel notices")
            await backoff.sleep()
        finally:
            try:
                await pubsub.aclose()
            except Exception:  # the connection is already gone
                pass
