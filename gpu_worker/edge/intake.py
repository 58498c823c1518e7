"""Reading work: new entries by lane priority and fair share, and reclaimed entries.

Each read first peeks (one script call per source: what waits, and the last entry id of
each stream), then reads only what the fair-share plan gives each tenant: entries are
never delivered to this worker unless it has places for them. When nothing waits, it
blocks in XREAD (which delivers nothing) until a new entry arrives anywhere, then reads.
On a cluster every call names one source's streams (one slot), and the calls of a read are
pipelined, so redis-py sends each node its share at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging

from gpu_worker.edge.fairshare import FairShare, Held
from gpu_worker.edge.inflight import LANE_PRIORITY, Entry
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_errors import Kind, classify
from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.edge.scripts import as_str
from gpu_worker.edge.sources import Source, Sources
from shared import keys

logger = logging.getLogger(__name__)


class Intake:
    """Never reads more new entries than it is asked for."""

    def __init__(self, io: RedisIO, options: WorkerOptions, sources: Sources,
                 fair: FairShare) -> None:
        self.io, self.options, self.sources, self.fair = io, options, sources, fair

    async def read(self, count: int, *, block: bool, held: dict[str, Held]) -> list[Entry]:
        """Up to ``count`` new entries, higher lanes first, shared between tenants by
        weight. If nothing waits and ``block``, wait up to ``block_ms`` for an entry."""
        peeked = await self._peek()
        entries = await self._read(peeked, count, held)
        if entries or not block:
            return entries
        if await self._ring(peeked):
            entries = await self._read(await self._peek(), count, held)
        return entries

    async def _peek(self) -> dict[str, tuple[int, str]]:
        """stream -> (entries waiting, last entry id). Missing groups are created."""
        sources = list(self.sources.by_name.values())
        replies = await self.io.run([("script", "peek", list(s.streams), [keys.GROUP])
                                     for s in sources])
        out, missing = {}, []
        for source, reply in zip(sources, replies):
            if isinstance(reply, Exception):
                logger.warning("cannot peek at %s: %s", source.name, reply)
                continue
            for stream, (backlog, last) in zip(source.streams, reply):
                if int(backlog) < 0:
                    missing.append(stream)
                out[stream] = (max(int(backlog), 0), as_str(last))
        if missing:  # a fresh stream, or Redis restarted without its data
            logger.info("recreating the group of %s", ", ".join(missing))
            await self.io.ensure_groups(missing)
        return out

    async def _read(self, peeked: dict[str, tuple[int, str]], count: int,
                    held: dict[str, Held]) -> list[Entry]:
        entries: list[Entry] = []
        error = None
        for lane in self.options.lanes:
            room = count - len(entries)
            if room <= 0:
                break
            lane_streams = {s.name: (stream, s) for s in self.sources.by_name.values()
                            for stream, ln in s.streams.items() if ln == lane}
            waiting = {name: peeked.get(stream, (0, ""))[0]
                       for name, (stream, _) in lane_streams.items()}
            weights = {name: s.config.weight for name, (_, s) in lane_streams.items()}
            caps = {name: s.config.max_running for name, (_, s) in lane_streams.items()}
            plan = self.fair.plan(waiting, weights, held, caps, room)
            reads = [(lane_streams[name], n) for name, n in plan.items()]
            replies = await self.io.run([
                ("XREADGROUP", "GROUP", keys.GROUP, self.options.worker_id, "COUNT", n,
                 "STREAMS", stream, ">") for (stream, _), n in reads])
            for ((stream, source), _), reply in zip(reads, replies):
                if isinstance(reply, Exception):
                    error = error or reply
                    if classify(reply) is Kind.MISSING:
                        await self.io.ensure_groups([stream])
                    continue
                entries += [_entry(source, as_str(name), entry_id, fields or {})
                            for name, items in reply or [] for entry_id, fields in items]
        if error is not None and not entries:
            raise error
        if error is not None:  # what was delivered must be served; the error comes back
            logger.warning("reading some streams failed: %s", error)
        return entries

    async def _ring(self, peeked: dict[str, tuple[int, str]]) -> bool:
        """Wait (XREAD, which delivers nothing) up to ``block_ms`` for an entry newer than
        the peeked ones in any stream. One call on a single server; one per source on a
        cluster, the first answer ending the wait."""
        groups = [{st: peeked.get(st, (0, "0-0"))[1] or "0-0" for st in s.streams}
                  for s in self.sources.by_name.values()]
        if not groups:
            await asyncio.sleep(self.options.block_ms / 1000)
            return False
        if not self.io.cluster:
            groups = [{st: i for g in groups for st, i in g.items()}]
        tasks = [asyncio.create_task(self.io.client.xread(g, count=1, block=self.options.block_ms))
                 for g in groups]
        try:
            await asyncio.wait(tasks, timeout=self.options.block_ms / 1000 + 1,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):  # (a CancelledError is not one)
                raise r
        return any(r and not isinstance(r, BaseException) for r in results)

    async def reclaim(self, count: int) -> list[Entry]:
        """Entries idle past ``claim_idle_ms`` (their worker is dead, or handed them back),
        higher lanes first, with their delivery counts; possibly more than ``count`` (the
        caller hands back the rest)."""
        streams = sorted(self.sources.streams.items(), key=lambda kv: LANE_PRIORITY[kv[1].streams[kv[0]]])
        replies = await self.io.run([
            ("XAUTOCLAIM", stream, keys.GROUP, self.options.worker_id,
             self.options.claim_idle_ms, "0-0", "COUNT", count) for stream, _ in streams])
        claimed: list[Entry] = []
        for (stream, source), reply in zip(streams, replies):
            if isinstance(reply, Exception):
                logger.warning("cannot reclaim from %s: %s", stream, reply)
                continue
            claimed += [_entry(source, stream, entry_id, fields) for entry_id, fields in reply[1]
                        if fields is not None]  # None: deleted from the stream while pending (6.2)
        if not claimed:
            return claimed
        pending = await asyncio.gather(*[  # rare: one call each, routed per key
            self.io.client.xpending_range(e.stream, keys.GROUP, e.entry_id, e.entry_id, 1)
            for e in claimed], return_exceptions=True)
        out = [dataclasses.replace(e, deliveries=1 if isinstance(info, Exception) or not info
                                   else int(info[0]["times_delivered"]))
               for e, info in zip(claimed, pending)]
        logger.info("reclaimed %d entries: %s", len(out),
                    ", ".join(f"{e.entry_id}x{e.deliveries}" for e in out))
        return out


def _entry(source: Source, stream: str, entry_id: bytes | str, fields: dict) -> Entry:
    return Entry(stream=stream, lane=source.streams[stream], entry_id=as_str(entry_id), fields=fields,
                 tenant=source.tenant)
