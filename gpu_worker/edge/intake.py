"""Reading work: new entries by lane priority, and reclaimed entries of dead workers."""
from __future__ import annotations

import logging

from gpu_worker.edge.inflight import Entry
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_io import RedisIO
from shared import keys

logger = logging.getLogger(__name__)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Intake:
    """XREADGROUP / XAUTOCLAIM for one worker. Never reads more than it is asked for."""

    def __init__(self, io: RedisIO, options: WorkerOptions) -> None:
        self.io = io
        self.options = options
        self.streams = {keys.stream_key(options.model_name, lane): lane for lane in options.lanes}

    async def read(self, count: int, *, block: bool) -> list[Entry]:
        """Up to ``count`` new entries, higher lanes first. If every lane is empty and
        ``block``, wait up to ``block_ms`` for the first entry of any lane; that wait may
        return one entry per lane, so the caller hands back any beyond ``count``."""
        entries: list[Entry] = []
        for stream in self.streams:
            if len(entries) >= count:
                break
            reply = await self.io.client.xreadgroup(
                keys.GROUP, self.options.worker_id, {stream: ">"}, count=count - len(entries))
            entries.extend(self._entries(reply))
        if entries or not block:
            return entries
        reply = await self.io.client.xreadgroup(
            keys.GROUP, self.options.worker_id, {s: ">" for s in self.streams}, count=1,
            block=self.options.block_ms)
        entries = self._entries(reply)
        rank = {s: i for i, s in enumerate(self.streams)}
        entries.sort(key=lambda e: rank[e.stream])
        return entries

    async def reclaim(self, count: int) -> list[Entry]:
        """Up to ``count`` entries idle past ``claim_idle_ms`` (their worker is dead, or
        handed them back), higher lanes first, with their delivery counts."""
        claimed: list[Entry] = []
        for stream, lane in self.streams.items():
            if len(claimed) >= count:
                break
            reply = await self.io.client.xautoclaim(
                stream, keys.GROUP, self.options.worker_id, self.options.claim_idle_ms,
                start_id="0-0", count=count - len(claimed))
            for entry_id, fields in reply[1]:
                if fields is None:  # deleted from the stream while pending (6.2)
                    continue
                claimed.append(Entry(stream=stream, lane=lane, entry_id=_s(entry_id),
                                     fields=fields))
        if not claimed:
            return claimed
        pipe = self.io.client.pipeline(transaction=False)
        for e in claimed:
            pipe.xpending_range(e.stream, keys.GROUP, e.entry_id, e.entry_id, 1)
        pending = await pipe.execute()
        out = []
        for entry, info in zip(claimed, pending):
            deliveries = int(info[0]["times_delivered"]) if info else 1
            out.append(Entry(stream=entry.stream, lane=entry.lane, entry_id=entry.entry_id,
                             fields=entry.fields, deliveries=deliveries))
        logger.info("reclaimed %d entries: %s", len(out),
                    ", ".join(f"{e.entry_id}x{e.deliveries}" for e in out))
        return out

    def _entries(self, reply) -> list[Entry]:
        entries = []
        for stream, items in reply or []:
            stream = _s(stream)
            for entry_id, fields in items:
                entries.append(Entry(stream=stream, lane=self.streams[stream],
                                     entry_id=_s(entry_id), fields=fields or {}))
        return entries
