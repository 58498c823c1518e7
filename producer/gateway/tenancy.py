"""Which tenants the gateway enqueues for: the fleet's tenant registry, re-read every few
seconds (as workers do), so a tenant added or removed with ``fleet tenants`` needs no
restart here either. An API key maps to a tenant (the keys file); the tenant must be in
the registry -- with an empty registry that is the implicit ``default`` only, the one tenant
workers then serve -- and allowed the gateway's lane. Anything else is refused (403)
before it reaches a stream no worker reads.
"""
from __future__ import annotations

import time

from producer.gateway.errors import GatewayError
from shared import keys, tenants
from shared.tenants import TenantConfig

REFRESH_S = 5.0


def _forbidden(message: str, code: str) -> GatewayError:
    return GatewayError(403, message, code=code)


class Registry:
    """The registry as of at most ``refresh_s`` ago (one HGETALL per refresh)."""

    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._configs: dict[str, TenantConfig] = {}
        self._empty = True
        self._read_at: float | None = None

    async def configs(self, redis) -> dict[str, TenantConfig]:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.refresh_s:
            raw = await redis.hgetall(keys.tenants_key())
            self._configs, _ = tenants.parse_registry(raw)  # workers log the invalid ones
            self._empty = not raw
            self._read_at = now
        return self._configs

    async def admit(self, redis, tenant: str, lane: str) -> TenantConfig:
        """The tenant's entry; a 403 where it is not registered or not allowed ``lane``."""
        config = (await self.configs(redis)).get(tenant)
        if config is None:
            hint = (f" (the registry is empty: only the implicit tenant {keys.DEFAULT_TENANT!r}"
                    " is served)" if self._empty else "")
            raise _forbidden(f"this API key's tenant {tenant!r} is not registered with the "
                             f"fleet{hint}; an operator adds it with `fleet tenants add "
                             f"{tenant}`", "tenant_not_registered")
        if lane not in config.lanes:
            raise _forbidden(f"tenant {tenant!r} may not use the {lane!r} lane this gateway "
                             f"enqueues into (its lanes: {', '.join(config.lanes)})",
                             "lane_not_allowed")
        return config

    async def served(self, redis, candidates: set[str], lane: str) -> list[str]:
        """The ``candidates`` this gateway can enqueue for now, by name."""
        configs = await self.configs(redis)
        return sorted(t for t in candidates if t in configs and lane in configs[t].lanes)
