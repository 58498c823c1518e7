"""The worker's Redis connection: pipelines of scripts, group setup, version checks."""
from __future__ import annotations

import asyncio
import logging
import random

from redis.exceptions import NoScriptError, OutOfMemoryError, ResponseError

from gpu_worker.edge import scripts
from shared import connect, keys
from shared.tasks import keep_cancellation

logger = logging.getLogger(__name__)

MIN_VERSION = (6, 2)  # XAUTOCLAIM; 7.0 adds XINFO lag and sharded pub/sub


class Backoff:
    """Exponential backoff with jitter, so a fleet does not reconnect in lockstep."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.base_s, self.cap_s, self._n = base_s, cap_s, 0

    async def sleep(self) -> None:
        delay = min(self.cap_s, self.base_s * 2 ** self._n) * random.uniform(0.5, 1.0)
        self._n = min(self._n + 1, 16)
        await asyncio.sleep(delay)

    def reset(self) -> None:
        self._n = 0


class RedisIO:
    """One client (a connection pool; per node on a cluster) plus what the worker derives
    from the server. ``client`` exists once :meth:`detect` has run."""

    def __init__(self, url: str, extra_scripts: dict[str, str] | None = None) -> None:
        self.url = url
        self.client = None
        self.cluster = False
        self.publish_command = "PUBLISH"
        self.scripts = {**scripts.ALL, **(extra_scripts or {})}
        self.shas = {n: scripts.Script(n, src).sha for n, src in self.scripts.items()}

    async def detect(self) -> None:
        """Connect (a cluster client where the server is a cluster node), read the server
        version, pick the pub/sub command (sharded on a cluster), load the scripts."""
        if self.client is None:
            self.client = await connect.async_client(
                self.url, decode_responses=False, socket_keepalive=True, health_check_interval=30)
            self.cluster = connect.is_cluster(self.client)
        info = await self.client.info("server")
        if self.cluster:  # one reply per node, or the default node's
            info = next(iter(info.values())) if "redis_version" not in info else info
        version = tuple(int(x) for x in str(info["redis_version"]).split(".")[:2])
        if version < MIN_VERSION:
            raise RuntimeError(f"Redis {info['redis_version']} is too old; need >= 6.2")
        self.publish_command = "SPUBLISH" if self.cluster and version >= (7, 0) else "PUBLISH"
        await self.load_scripts()

    async def load_scripts(self) -> None:
        """Into every primary on a cluster (scripts are cached per node)."""
        for source in self.scripts.values():
            if self.cluster:
                await self.client.execute_command("SCRIPT", "LOAD", source,
                                                  target_nodes=self.client.get_primaries())
            else:
                await self.client.script_load(source)

    async def ensure_groups(self, streams: list[str]) -> None:
        """Create the group of every stream from id 0 (never ``$``: entries added while the
        group was missing are work too), creating the stream if needed."""
        for stream in streams:
            try:
                await self.client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
                logger.info("created consumer group %s on %s", keys.GROUP, stream)
            except OutOfMemoryError:
                # Refused even when the group exists; if it does not, reading says NOGROUP
                # and the group is created once the server takes writes again.
                logger.warning("cannot check the group of %s: Redis is out of memory", stream)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def run(self, calls: list[tuple]) -> list:
        """Run ``calls`` in one pipelined round-trip; results in order, errors as values.

        A call is ``("script", name, keys, args)`` or a raw command tuple. If the server lost
        its script cache (restart), the scripts are loaded and the pipeline is run again.
        """
        for attempt in (0, 1):
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                if call[0] == "script":
                    _, name, script_keys, args = call
                    # (raw: redis-py refuses pipe.evalsha on a cluster, but routes this by KEYS)
                    pipe.execute_command("EVALSHA", self.shas[name], len(script_keys),
                                         *script_keys, *args)
                else:
                    pipe.execute_command(*call)
            # (redis-py 8 can return here from a cancelled task: raise it again)
            results = await keep_cancellation(pipe.execute(raise_on_error=False))
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                await self.load_scripts()
                continue
            return results
        return results

    async def script(self, name: str, script_keys: list[str], args: list) -> object:
        """One script call; raises what it raises."""
        (result,) = await self.run([("script", name, script_keys, args)])
        if isinstance(result, Exception):
            raise result
        return result

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
