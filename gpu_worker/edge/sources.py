"""Where a worker's work comes from: one source per tenant (its lane streams, one slot),
discovered from the tenant registry, plus the old shared streams while they hold work.

A :class:`Source` is the unit one Redis call can read on a cluster: all its streams share a
hash tag. The registry is re-read every ``tenants_refresh_s``; a tenant added is read from
then on, one removed is no longer read (its entries stay in its streams, untouched).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.edge.options import WorkerOptions
from shared import keys, tenants
from shared.tenants import TenantConfig

logger = logging.getLogger(__name__)

LEGACY = "_legacy"  # the source name of the old shared streams (the payload names tenants)

# KEYS: the streams of one source. ARGV: group. -> per stream {backlog, last entry id};
# backlog -1: the stream or its group is missing (create it). Backlog is the group's lag
# (entries never delivered), or length minus pending where the server cannot say (6.2,
# deleted entries): acknowledged entries are deleted, so the rest is pending or undelivered.
PEEK = """
local out = {}
for _, key in ipairs(KEYS) do
  local backlog, last = -1, '0-0'
  if redis.call('EXISTS', key) == 1 then
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
    if ok then
      for _, g in ipairs(groups) do
        local f = {}
        for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
        if f['name'] == ARGV[1] then
          if f['lag'] then backlog = f['lag']
          else backlog = math.max(redis.call('XLEN', key) - f['pending'], 0) end
        end
      end
      local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
      if top[1] then last = top[1][1] end
    end
  end
  table.insert(out, {backlog, last})
end
return out
"""
SCRIPTS = {"peek": PEEK}


@dataclass(frozen=True)
class Source:
    """Streams read together: ``streams`` maps stream -> lane, highest lane first."""

    name: str  # the tenant, or LEGACY
    config: TenantConfig
    streams: dict[str, str]

    @property
    def tenant(self) -> str | None:
        """The tenant every entry of these streams belongs to (None: the payload says)."""
        return None if self.name.startswith(LEGACY) else self.name


def tenant_source(options: WorkerOptions, config: TenantConfig) -> Source | None:
    lanes = [lane for lane in options.lanes if lane in config.lanes]
    if not lanes:
        return None
    return Source(config.name, config,
                  {keys.stream_key(options.model_name, config.name, lane): lane for lane in lanes})


def legacy_sources(options: WorkerOptions) -> list[Source]:
    """One source per old shared stream (each in its own slot on a cluster)."""
    config = TenantConfig(name=LEGACY, lanes=list(keys.LANES))
    return [Source(f"{LEGACY}:{lane}", config, {keys.legacy_stream_key(options.model_name, lane): lane})
            for lane in options.lanes]


class Sources:
    """The worker's current sources, refreshed from the registry."""

    def __init__(self, io: RedisIO, options: WorkerOptions) -> None:
        self.io, self.options = io, options
        self.by_name: dict[str, Source] = {}
        self.bad: list[str] = []

    @property
    def streams(self) -> dict[str, Source]:
        """stream -> its source."""
        return {stream: s for s in self.by_name.values() for stream in s.streams}

    async def refresh(self) -> tuple[list[Source], list[Source]]:
        """Re-read the registry (and whether old shared streams still exist); the sources
        added and removed since the last refresh. New tenants' groups are created."""
        raw = await self.io.client.hgetall(keys.tenants_key())
        configs, bad = tenants.parse_registry(raw)
        if bad and bad != self.bad:
            logger.error("tenant registry: ignoring invalid entries %s", ", ".join(sorted(bad)))
        self.bad = bad
        found = {s.name: s for s in (tenant_source(self.options, c) for c in configs.values())
                 if s is not None}
        if self.options.legacy_streams:
            legacy = legacy_sources(self.options)
            exists = await self.io.run([("EXISTS", next(iter(s.streams))) for s in legacy])
            found.update({s.name: s for s, e in zip(legacy, exists) if e == 1})
        added = [s for n, s in found.items() if self.by_name.get(n) != s]
        removed = [s for n, s in self.by_name.items() if n not in found]
        if added:
            await self.io.ensure_groups([st for s in added for st in s.streams])
        self.by_name = found
        for s in added:
            logger.info("serving %s: %s", s.name, ", ".join(s.streams))
        for s in removed:
            logger.info("no longer serving %s", s.name)
        return added, removed
