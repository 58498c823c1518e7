"""Backpressure before enqueueing: a bounded queue per tenant (503) and per-tenant quotas
(429).

Quota counters live in Redis, so every gateway replica draws on the same budget; they are
crash-safe: the per-minute counter expires with its window, and an in-flight slot is a
sorted-set member scored by its expiry, so a slot a crashed gateway never released lapses.
"""
from __future__ import annotations

import math
import time

from redis.exceptions import ResponseError

from producer.gateway.errors import overloaded, rate_limited
from producer.gateway.options import GatewayOptions
from shared import keys

# KEYS: rpm counter, in-flight zset. ARGV: rpm limit, window ttl s, concurrent limit, now,
# slot member, slot expiry. Returns {0, 0} admitted, {1, 0} rpm spent, {2, 0} no free slot.
_ADMIT = """
if tonumber(ARGV[3]) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[4])
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return {2, 0} end
end
if tonumber(ARGV[1]) > 0 then
  local used = tonumber(redis.call('GET', KEYS[1]) or '0')
  if used >= tonumber(ARGV[1]) then return {1, 0} end
  redis.call('INCR', KEYS[1])
  if used == 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[2] + math.ceil(ARGV[6] - ARGV[4]))
end
return {0, 0}
"""


def _tenant_keys(tenant: str, window: int) -> list[str]:
    # One hash tag per tenant: the script's keys share a Redis Cluster slot.
    tag = "{" + tenant + "}"
    return [f"{keys.PREFIX}:gateway:{tag}:rpm:{window}", f"{keys.PREFIX}:gateway:{tag}:inflight"]


class Admission:
    """``check_queue`` raises 503 when a tenant's lane is overfull; ``acquire``/``release``
    bracket a request against its tenant's quota (429 when spent)."""

    def __init__(self, redis, options: GatewayOptions) -> None:
        self.redis = redis  # a Redis or RedisCluster client: every call stays in one slot
        self.options = options
        self._admit = redis.register_script(_ADMIT)

    async def queue_depth(self, namespace: str, tenant: str) -> int:
        """Requests in the tenant's stream of the lane no worker has taken yet (the consumer
        group's lag). Each tenant has its own bound: one tenant's flood does not turn the
        others away.

        Served entries are deleted when acknowledged, so the stream holds exactly the
        pending (being served) plus the undelivered ones; this works on Redis 6.2 as well.
        """
        stream = keys.stream_key(namespace, tenant, self.options.lane)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xpending(stream, keys.GROUP)
        length, pending = await pipe.execute(raise_on_error=False)
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, ResponseError):
            if not str(pending).startswith("NOGROUP"):
                raise pending  # NOPERM, OOM, LOADING...: not an empty queue
            return int(length)  # no group yet: nothing was ever delivered
        return max(int(length) - int(pending["pending"]), 0)

    async def check_queue(self, namespace: str, tenant: str) -> None:
        bound = self.options.max_queue
        if bound <= 0:
            return
        depth = await self.queue_depth(namespace, tenant)
        if depth >= bound:
            raise overloaded(f"the fleet is overloaded: {depth} requests are waiting for "
                             f"model {namespace!r} in tenant {tenant!r}'s queue (bound "
                             f"{bound}); retry later", self.options.retry_after_s)

    async def acquire(self, tenant: str, slot: str) -> None:
        quota = self.options.quota(tenant)
        if not quota.requests_per_minute and not quota.max_concurrent:
            return
        now = time.time()
        window = int(now // 60)
        expiry = now + self.options.request_timeout_s + 60
        status, _ = await self._admit(keys=_tenant_keys(tenant, window), args=[
            quota.requests_per_minute, 61, quota.max_concurrent, repr(now), slot, repr(expiry)])
        if status == 1:
            retry = max(math.ceil((window + 1) * 60 - now), 1)
            raise rate_limited(f"tenant {tenant!r} has used its quota of "
                               f"{quota.requests_per_minute} requests per minute", retry)
        if status == 2:
            raise rate_limited(f"tenant {tenant!r} already has {quota.max_concurrent} "
                               "requests in flight (its quota)", self.options.retry_after_s)

    async def release(self, tenant: str, slot: str) -> None:
        if self.options.quota(tenant).max_concurrent:
            await self.redis.zrem(_tenant_keys(tenant, 0)[1], slot)
