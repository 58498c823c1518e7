"""One pub/sub connection shared by every request of a client, with reconnection.

``subscribe(channel)`` returns only once the server confirmed the subscription, so a
request submitted afterwards cannot publish before its client listens. After a lost
connection every channel is subscribed again and its queue receives :data:`RECONNECTED`,
so the stream reading it recovers what it missed from the stored progress.
"""
from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

RECONNECTED = object()
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


class Subscriptions:
    def __init__(self, client: aioredis.Redis, *, sharded: bool = False) -> None:
        self._client = client
        self._sharded = sharded
        self._queues: dict[str, asyncio.Queue] = {}
        self._confirm: dict[str, asyncio.Future] = {}
        self._pubsub = None
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def subscribe(self, channel: str) -> asyncio.Queue:
        async with self._lock:
            queue = self._queues.setdefault(channel, asyncio.Queue())
            confirmed = asyncio.get_running_loop().create_future()
            self._confirm[channel] = confirmed
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            await self._send("subscribe", channel)  # connects the pub/sub before it is read
            self._ensure_reader()
        await asyncio.wait_for(confirmed, timeout=10)
        return queue

    async def unsubscribe(self, channel: str) -> None:
        self._queues.pop(channel, None)
        self._confirm.pop(channel, None)
        if self._pubsub is not None:
            try:
                await self._send("unsubscribe", channel)
            except _TRANSIENT:
                pass  # the connection is gone, and so is the subscription

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._pubsub is not None:
            await self._pubsub.aclose()

    async def _send(self, kind: str, *channels: str) -> None:
        method = {("subscribe", False): self._pubsub.subscribe,
                  ("subscribe", True): self._pubsub.ssubscribe,
                  ("unsubscribe", False): self._pubsub.unsubscribe,
                  ("unsubscribe", True): self._pubsub.sunsubscribe}[(kind, self._sharded)]
        await method(*channels)

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        """Deliver messages until cancelled; never dies of an error (it resubscribes)."""
        while True:
            if self._pubsub.connection is None:  # nothing subscribed since a reconnect
                await asyncio.sleep(0.05)
                continue
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - lost connection, or a protocol surprise
                logger.warning("pub/sub connection lost (%r); resubscribing", exc)
                await self._resubscribe()
                continue
            if message is None:
                continue
            channel = message.get("channel")
            channel = channel.decode() if isinstance(channel, bytes) else channel
            kind = message.get("type")
            if kind in ("subscribe", "ssubscribe"):
                future = self._confirm.pop(channel, None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif kind in ("message", "smessage") and channel in self._queues:
                self._queues[channel].put_nowait(message["data"])

    async def _resubscribe(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._pubsub.aclose()
                self._pubsub = self._client.pubsub()
                if self._queues:
                    await self._send("subscribe", *self._queues)
                break
            except _TRANSIENT:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        for queue in self._queues.values():
            queue.put_nowait(RECONNECTED)
