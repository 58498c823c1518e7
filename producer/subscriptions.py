"""Pub/sub for every request of a client, with reconnection; sharded on a Redis Cluster.

``subscribe(channel)`` returns only once the server confirmed the subscription, so a
request submitted afterwards cannot publish before its client listens. On a single server
one connection carries every channel (SUBSCRIBE). On a cluster each channel is SSUBSCRIBEd
on the node that owns its slot, one connection per node. After a lost connection (a node
killed, a failover) or a slot moved away (the server ends the subscription), each affected
channel is subscribed again where its slot lives now and its queue receives
:data:`RECONNECTED`, so the stream reading it recovers what it missed from stored progress.
"""
from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import connect
from shared.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

RECONNECTED = object()
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError,
              asyncio.TimeoutError)
_NODE_KWARGS = ("username", "password", "credential_provider", "socket_connect_timeout",
                "socket_keepalive", "client_name")


class _Connection:
    """One pub/sub connection (to the server, or to one cluster node) and its reader."""

    def __init__(self, owner: "Subscriptions", client: aioredis.Redis, sharded: bool) -> None:
        self.owner, self.client, self.sharded = owner, client, sharded
        self.pubsub = client.pubsub()
        self.channels: set[str] = set()
        self.reader: asyncio.Task | None = None
        self.closing = False

    async def send(self, kind: str, *channels: str) -> None:
        if kind == "subscribe":
            await (self.pubsub.ssubscribe if self.sharded else self.pubsub.subscribe)(*channels)
        else:
            await (self.pubsub.sunsubscribe if self.sharded else self.pubsub.unsubscribe)(*channels)
        if self.reader is None or self.reader.done():
            self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        """Deliver messages until closed; a failure hands its channels back to the owner."""
        while not self.closing:
            try:
                message = await self.pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - lost connection, or a protocol surprise
                logger.warning("pub/sub connection lost (%r); resubscribing", exc)
                asyncio.create_task(self.owner._lost(self))
                return
            if message is not None:
                self.owner._deliver(self, message)

    async def close(self) -> None:
        self.closing = True  # the reader ends on it even if its cancellation is lost
        await cancel_and_wait([self.reader], logger)
        try:
            await self.pubsub.aclose()
        finally:
            if self.client is not self.owner._client:
                await self.client.aclose()


class Subscriptions:
    def __init__(self, client, *, sharded: bool = False) -> None:
        self._client = client
        self._cluster = connect.is_cluster(client)
        self._sharded = sharded
        self._queues: dict[str, asyncio.Queue] = {}
        self._confirm: dict[str, asyncio.Future] = {}
        self._conns: dict[str, _Connection] = {}  # "" on a single server, else node name
        self._by_channel: dict[str, _Connection] = {}
        self._lock = asyncio.Lock()

    async def subscribe(self, channel: str, *, timeout: float = 30.0) -> asyncio.Queue:
        """Subscribed once this returns; retried through a failover for up to ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout
        delay = 0.05
        while True:
            try:
                async with self._lock:
                    queue = self._queues.setdefault(channel, asyncio.Queue())
                    confirmed = asyncio.get_running_loop().create_future()
                    self._confirm[channel] = confirmed
                    await self._subscribe_on_owner(channel)
                await asyncio.wait_for(confirmed, timeout=10)
                return queue
            except _TRANSIENT as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
                logger.info("subscribing to %s failed (%r); retrying", channel, exc)
                await self._forget(self._by_channel.pop(channel, None))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                if self._cluster:
                    await self._client.nodes_manager.initialize()

    async def unsubscribe(self, channel: str) -> None:
        self._queues.pop(channel, None)
        self._confirm.pop(channel, None)
        conn = self._by_channel.pop(channel, None)
        if conn is not None:
            conn.channels.discard(channel)
            try:
                await conn.send("unsubscribe", channel)
            except Exception:  # noqa: BLE001 - the connection is gone, and so is the subscription
                pass

    async def close(self) -> None:
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()

    async def _subscribe_on_owner(self, channel: str) -> None:
        conn = self._connection_for(channel)
        conn.channels.add(channel)
        self._by_channel[channel] = conn
        await conn.send("subscribe", channel)

    def _connection_for(self, channel: str) -> _Connection:
        if not self._cluster:
            name, client = "", self._client
        else:
            node = self._client.get_node_from_key(channel)
            name = node.name
            if name in self._conns:
                return self._conns[name]
            kwargs = {k: v for k, v in node.connection_kwargs.items()
                      if k in _NODE_KWARGS or k.startswith("ssl_")}
            if issubclass(node.connection_class, SSLConnection):
                kwargs["ssl"] = True
            client = aioredis.Redis(host=node.host, port=node.port, **kwargs)
        if name not in self._conns:
            self._conns[name] = _Connection(self, client, self._sharded)
        return self._conns[name]

    def _deliver(self, conn: _Connection, message: dict) -> None:
        channel = message.get("channel")
        channel = channel.decode() if isinstance(channel, bytes) else channel
        kind = message.get("type")
        if kind in ("subscribe", "ssubscribe"):
            future = self._confirm.pop(channel, None)
            if future is not None and not future.done():
                future.set_result(None)
        elif kind in ("message", "smessage") and channel in self._queues:
            self._queues[channel].put_nowait(message["data"])
        elif kind == "sunsubscribe" and channel in self._queues and \
                self._by_channel.get(channel) is conn:
            # Not asked for: the channel's slot moved to another node (resharding).
            conn.channels.discard(channel)
            asyncio.create_task(self._moved([channel]))

    async def _forget(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        name = next((n for n, c in self._conns.items() if c is conn), None)
        if name is not None:
            del self._conns[name]
        try:
            await conn.close()
        except Exception:  # noqa: BLE001 - already broken
            pass

    async def _lost(self, conn: _Connection) -> None:
        """A connection failed: its channels go wherever their slots live now."""
        await self._forget(conn)
        await self._moved([ch for ch in conn.channels if ch in self._queues])

    async def _moved(self, channels: list[str]) -> None:
        delay = 0.05
        while channels:
            try:
                async with self._lock:
                    if self._cluster:
                        await self._client.nodes_manager.initialize()  # the new slot owners
                    for channel in list(channels):
                        if channel in self._queues:
                            await self._subscribe_on_owner(channel)
                        channels.remove(channel)
                        if channel in self._queues:
                            self._queues[channel].put_nowait(RECONNECTED)
            except Exception as exc:  # noqa: BLE001 - the cluster is still failing over
                logger.info("resubscribing %d channels failed (%r); retrying", len(channels), exc)
                for channel in channels:  # drop half-made routes; the next try remakes them
                    self._by_channel.pop(channel, None)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
