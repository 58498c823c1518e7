"""The worker's background duties: lease renewal, cancel notices, heartbeats."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

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
    by_stream: dict[str, list] = {}
    for inf in held:
        by_stream.setdefault(inf.entry.stream, []).append(inf)
    # Each call beside what its reply means, so no reply is read by position.
    plan: list[tuple[tuple, Callable[[object], None]]] = [
        (calls.renew(state.options, stream, [inf.entry.entry_id for inf in infs]),
         functools.partial(_on_renewed, state, infs)) for stream, infs in by_stream.items()]
    plan += [(("EXISTS", inf.redis_keys.cancel), functools.partial(_on_cancel_key, state, inf))
             for inf in held]
    if not plan:
        return
    results = await state.io.run([call for call, _ in plan])
    for (_, handle), result in zip(plan, results):
        if isinstance(result, Exception):
            raise result
        handle(result)


def _on_renewed(state: WorkerState, infs: list, lost_ids: list) -> None:
    lost = {i.decode() if isinstance(i, bytes) else i for i in lost_ids}
    for inf in infs:
        if inf.entry.entry_id in lost:
            state.lose(inf.key, "lease taken over")


def _on_cancel_key(state: WorkerState, inf, exists: int) -> None:
    if exists:
        state.cancel(inf.key)


async def lease_loop(state: WorkerState) -> None:
    while not state.stopping:
        await asyncio.sleep(state.options.renew_interval_s)
        try:
            await renew_leases(state)
        except Exception as exc:  # noqa: BLE001 - the next renewal tries again
            state.redis.on_error(exc, "renewing leases")


async def heartbeat_once(state: WorkerState) -> None:
    opts = state.options
    key = keys.worker_key(opts.model_name, opts.worker_id)
    now = time.time()
    mapping = {**state.status(), "last_seen": now, "lanes": ",".join(opts.lanes)}
    await state.io.run([("HSET", key, *[x for kv in mapping.items() for x in kv]),
                        ("PEXPIRE", key, int(opts.heartbeat_s * 3000)),  # 3 beats
                        ("ZADD", keys.workers_key(opts.model_name), now, opts.worker_id)])


async def heartbeat_loop(state: WorkerState) -> None:
    while not state.stopping:
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
    while not state.stopping:
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
            with contextlib.suppress(Exception):  # the connection is already gone
                await pubsub.aclose()
