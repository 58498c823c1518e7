"""Connecting to the fleet's Redis: one server or a Redis Cluster, told apart at connect.

Given the URL of any node, ``INFO cluster`` says whether the server is a cluster node
(``cluster_enabled:1``); if so the client is a cluster client that routes each command to
the node owning its key's slot and follows MOVED/ASK redirects and failovers. Events are
then read with sharded pub/sub (SSUBSCRIBE). redis-py is imported lazily so the protocol
modules stay importable without it.
"""
from __future__ import annotations

from typing import Any


RETRIES = 12  # a failover takes a few node timeouts: retry long enough to ride it out


def _cluster_kwargs(retry_class) -> dict[str, Any]:
    from redis.backoff import ExponentialWithJitterBackoff
    return {"require_full_coverage": False,
            "retry": retry_class(ExponentialWithJitterBackoff(base=0.05, cap=1.0), RETRIES)}


def _enabled(info: dict) -> bool:
    return str(info.get("cluster_enabled", "0")) == "1"


async def async_client(url: str, **kwargs: Any):
    """A ``redis.asyncio.Redis`` for a single server, or a ``redis.asyncio.RedisCluster``
    (bootstrapped from this node) where the server is a cluster node."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster
    from redis.exceptions import NoPermissionError
    probe = aioredis.from_url(url, **kwargs)
    try:
        cluster = _enabled(await probe.info("cluster"))
    except NoPermissionError:
        cluster = False
    if not cluster:
        return probe
    await probe.aclose()
    from redis.asyncio.retry import Retry
    client = RedisCluster.from_url(url, **_cluster_kwargs(Retry), **kwargs)
    await client.initialize()  # the slot map, before any command names a node
    return client


def sync_client(url: str, **kwargs: Any):
    """The blocking twin of :func:`async_client`."""
    import redis
    from redis.cluster import RedisCluster
    from redis.exceptions import NoPermissionError
    probe = redis.Redis.from_url(url, **kwargs)
    try:
        cluster = _enabled(probe.info("cluster"))
    except NoPermissionError:
        cluster = False
    if not cluster:
        return probe
    probe.close()
    from redis.retry import Retry
    return RedisCluster.from_url(url, **_cluster_kwargs(Retry), **kwargs)


def is_cluster(client: Any) -> bool:
    """True for the cluster clients :func:`async_client` / :func:`sync_client` return."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.cluster import RedisCluster
    return isinstance(client, (AsyncCluster, RedisCluster))
