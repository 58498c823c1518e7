"""The client's shared pub/sub connection: its reader never dies, whatever it meets."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from redis_server import RedisServer

from producer.subscriptions import Subscriptions


async def _first_subscribe_then_restart(server: RedisServer) -> None:
    client = aioredis.from_url(server.url)  # no connection opened yet
    subs = Subscriptions(client)
    t0 = time.monotonic()
    await subs.subscribe("fleet:req:{default/one}:events")
    # Before: the reader started before the connection, died, and this waited 10 s.
    assert time.monotonic() - t0 < 2
    await subs.unsubscribe("fleet:req:{default/one}:events")
    server.restart()  # a reconnect with no channel left to subscribe
    await asyncio.sleep(1.5)
    queue = await asyncio.wait_for(subs.subscribe("fleet:req:{default/two}:events"), 15)
    await client.publish("fleet:req:{default/two}:events", b"hello")
    while await asyncio.wait_for(queue.get(), 5) != b"hello":
        pass  # RECONNECTED markers may come first
    await subs.close()
    await client.aclose()


def test_the_reader_survives_a_first_subscribe_and_a_restart_with_nothing_subscribed():
    server = RedisServer().start()
    try:
        asyncio.run(_first_subscribe_then_restart(server))
    finally:
        server.stop()
