"""The gateway's shared state: its Redis client, the tenant registry, and one fleet client
per served namespace and tenant.

Redis is connected at first use, not at start: ``shared.connect`` asks the server whether
it is a cluster node, and a gateway must start (and answer 503) while Redis is away. On a
cluster every client is a cluster client, and every Redis step of a call stays in one slot.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import NoPermissionError
from starlette.requests import Request as HttpRequest

from producer.client import AsyncFleetClient
from producer.gateway import errors
from producer.gateway.admission import Admission
from producer.gateway.options import GatewayOptions
from producer.gateway.render import TokenNames
from producer.gateway.tenancy import Registry
from shared import connect, keys

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Gateway:
    """State shared by all calls."""

    def __init__(self, options: GatewayOptions) -> None:
        self.options = options
        self.names = TokenNames(options.tokenizer)
        self.registry = Registry()
        self.background: set[asyncio.Task] = set()
        self._redis = None
        self._admission: Admission | None = None
        self._clients: dict[tuple[str, str], AsyncFleetClient] = {}
        self._lock = asyncio.Lock()  # one connection attempt at a time

    async def close(self) -> None:
        if self.background:
            await asyncio.wait(self.background, timeout=10)
        for client in self._clients.values():
            await client.close()
        if self._redis is not None:
            await self._redis.aclose()

    async def redis(self):
        """The gateway's own client (a cluster client where Redis is a cluster)."""
        if self._redis is None:
            async with self._lock:
                if self._redis is None:
                    timeout = self.options.redis_timeout_s
                    self._redis = await connect.async_client(
                        self.options.redis_url, socket_timeout=timeout,
                        socket_connect_timeout=timeout)
        return self._redis

    async def admission(self) -> Admission:
        if self._admission is None:
            self._admission = Admission(await self.redis(), self.options)
        return self._admission

    def client(self, namespace: str, tenant: str) -> AsyncFleetClient:
        """The fleet client that enqueues into ``tenant``'s streams of ``namespace`` (not
        connected yet: see :meth:`connected`)."""
        key = (namespace, tenant)
        if key not in self._clients:
            self._clients[key] = AsyncFleetClient(self.options.redis_url, model=namespace,
                                                  tenant=tenant)
        return self._clients[key]

    async def connected(self, client: AsyncFleetClient) -> AsyncFleetClient:
        async with self._lock:
            redis = await client.connect()
            if connect.is_cluster(redis):
                # A cluster client learns its slots at its first command; the first call of
                # a submission is a sharded subscribe, which needs them already.
                await redis.initialize()
        return client

    async def redis_step(self, step: Awaitable[T]) -> T:
        """``step`` within ``redis_timeout_s``, else 503: redis-py retries a dead or silent
        server for a minute, and a hanging call would hold its client that long."""
        try:
            return await asyncio.wait_for(step, self.options.redis_timeout_s)
        except asyncio.TimeoutError:
            logger.warning("redis did not answer within %.1f s", self.options.redis_timeout_s)
            raise errors.unavailable(self.options.retry_after_s) from None

    async def admit(self, tenant: str) -> None:
        """403 unless ``tenant`` is registered and allowed the gateway's lane."""
        await self.registry.admit(await self.redis(), tenant, self.options.lane)

    async def served_tenants(self) -> list[str]:
        """The tenants of the configured keys (``default`` without keys) that can enqueue."""
        candidates = set(self.options.api_keys.values()) or {keys.DEFAULT_TENANT}
        return await self.registry.served(await self.redis(), candidates, self.options.lane)

    async def live_workers(self, namespace: str) -> int | None:
        """Workers registered for ``namespace``; None where this Redis user may not read the
        registry (the shipped ``fleet-gateway`` user may not, and needs not: see ``ready``)."""
        try:
            redis = await self.redis_step(self.redis())
            return await self.redis_step(redis.zcard(keys.workers_key(namespace)))
        except NoPermissionError:
            return None

    def tenant(self, request: HttpRequest) -> str:
        """The tenant of the call's API key (401 without a valid one)."""
        if not self.options.api_keys:
            return keys.DEFAULT_TENANT
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        tenant = self.options.api_keys.get(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise errors.GatewayError(401, "invalid or missing API key (Authorization: Bearer "
                                      "KEY)", code="invalid_api_key")
        return tenant

    def namespace(self, model: str) -> str:
        if model not in self.options.models:
            raise errors.GatewayError(404, f"the model {model[:64]!r} does not exist; served: "
                                      f"{sorted(self.options.models)}", param="model",
                                      code="model_not_found")
        return self.options.models[model]
