"""The asyncio client.

    async with AsyncFleetClient("redis://localhost:6379/0") as fleet:
        stream = await fleet.submit(messages=[{"role": "user", "content": "Hi"}], max_tokens=32)
        async for token in stream:
            print(token.text, end="")
        result = await stream.result()
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import msgspec
import redis.exceptions

from producer.errors import PayloadTooLarge
from producer.stream import RequestStream
from producer.structured_output import from_response_format
from producer.subscriptions import Subscriptions
from shared import codec, connect, keys, limits
from shared.digest import request_digest
from shared.protocol import Cancel, Failure, Request, Result, Token

logger = logging.getLogger(__name__)


def default_redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def encode_request(request: Request) -> bytes:
    """The stream entry's payload; :class:`PayloadTooLarge` if the fleet would refuse it
    unread for its size."""
    payload = codec.encode(request)
    if len(payload) > limits.MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(len(payload))
    return payload


class AsyncFleetClient:
    """Submits to one tenant's streams of one model; ``tenant`` is also the default for
    lookups. The URL may name a single server or any node of a Redis Cluster (told apart
    when the client first connects).

    poll_s: how long a stream waits in silence before reading the stored state (covers
    lost pub/sub messages); batch pipelines with many requests in flight use a larger one.
    """

    def __init__(self, redis_url: str | None = None, *, model: str = "default",
                 tenant: str = keys.DEFAULT_TENANT, poll_s: float = 2.0,
                 **redis_options: Any) -> None:
        self.model = keys.check_model(model)
        self.tenant = keys.check_tenant(tenant)
        self.poll_s = poll_s
        self.url = redis_url or default_redis_url()
        self._redis_options = {"decode_responses": False, **redis_options}
        self._redis = None
        self._subs: Subscriptions | None = None

    async def __aenter__(self) -> "AsyncFleetClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self):
        """The Redis client (a cluster client where the server is a cluster node)."""
        if self._redis is None:
            self._redis = await connect.async_client(self.url, **self._redis_options)
        return self._redis

    @property
    def redis(self):
        if self._redis is None:
            raise RuntimeError("not connected: use `async with` or await connect() first")
        return self._redis

    async def close(self) -> None:
        if self._subs is not None:
            await self._subs.close()
        if self._redis is not None:
            await self._redis.aclose()

    async def _subscriptions(self) -> Subscriptions:
        if self._subs is None:
            client = await self.connect()
            self._subs = Subscriptions(client, sharded=connect.is_cluster(client))
        return self._subs

    def make_request(self, request: Request | None = None, **fields: Any) -> Request:
        """A :class:`Request` from fields (a fresh id and this client's tenant by default).
        ``structured={"type": "json_schema", "schema": {...}}`` (or ``json_object``, ``regex``
        with ``pattern``, ``choice`` with ``choices``, ``grammar`` with ``ebnf``) constrains
        the output; ``response_format=`` takes OpenAI's form of the same."""
        if request is not None:
            return request
        if "response_format" in fields:
            fields["structured"] = from_response_format(fields.pop("response_format"))
        fields.setdefault("request_id", uuid.uuid4().hex)
        fields.setdefault("tenant", self.tenant)
        fields.setdefault("submitted_at", time.time())
        return msgspec.convert(fields, Request)

    async def submit(self, request: Request | None = None, **fields: Any) -> RequestStream:
        """Subscribe to the request's channel, then enqueue it; return its stream.

        Idempotent by ``request_id``: a request already done is not enqueued again (its
        stored result is returned), and a duplicate entry is never generated twice. The
        same id with a different request ends with :class:`IdConflict` (``id_conflict``),
        never with the other request's answer. ``n=3``: three choices (``Token.index``,
        ``Result.choices``).
        """
        request = self.make_request(request, **fields)
        if request.tenant is None:
            request = msgspec.structs.replace(request, tenant=self.tenant)
        payload = encode_request(request)
        stream = await self.watch(request.request_id, request.tenant,
                                  digest=request_digest(request))
        if stream.done:  # its stored result, or id_conflict: the id holds another request
            return stream
        stream_key = keys.stream_key(self.model, request.tenant, request.priority)
        try:
            entry_id = await self.redis.xadd(stream_key, {keys.STREAM_FIELD: payload})
        except BaseException:  # not enqueued (OOM, NOPERM, lost): no subscription left behind
            await stream.close()
            raise
        stream.entry_ref = f"{stream_key}|{entry_id.decode() if isinstance(entry_id, bytes) else entry_id}"
        return stream

    async def watch(self, request_id: str, tenant: str | None = None, *,
                    digest: str | None = None) -> RequestStream:
        """A stream for a request submitted elsewhere (or before a reconnect): subscribes,
        then replays what is stored, so nothing published before or after is missed.
        ``digest`` (:func:`shared.digest.request_digest`): the stream ends with
        ``id_conflict`` rather than deliver the events of a different request."""
        tenant = tenant or self.tenant
        subs = await self._subscriptions()
        channel = keys.channel(tenant, request_id)
        queue = await subs.subscribe(channel)
        stream = RequestStream(self.redis, queue, tenant=tenant, request_id=request_id,
                               poll_s=self.poll_s, on_close=lambda s: subs.unsubscribe(channel),
                               digest=digest)
        await stream.recover()
        return stream

    async def generate(self, request: Request | None = None, *, timeout: float | None = None,
                       **fields: Any) -> Result:
        """Submit and wait for the result; raises :class:`RequestFailed` on a failure."""
        stream = await self.submit(request, **fields)
        return await stream.result(timeout)

    async def cancel(self, request_id: str, tenant: str | None = None,
                     ttl_s: int = 24 * 3600) -> None:
        """Cancel a queued or running request; it ends with finish reason ``cancelled``."""
        tenant = tenant or self.tenant
        await self.connect()
        # The key is what makes cancellation certain; the notice only makes it quick, and a
        # tenant's ACL user may not be allowed to publish it.
        await self.redis.set(keys.cancel_key(tenant, request_id), b"1", ex=ttl_s)
        try:
            await self.redis.publish(keys.control_channel(self.model),
                                     codec.encode(Cancel(request_id=request_id, tenant=tenant)))
        except redis.exceptions.NoPermissionError:
            logger.debug("no permission to publish the cancel notice; workers see the key")

    async def get_result(self, request_id: str, tenant: str | None = None) -> Result | Failure | None:
        """The stored terminal event, or None while the request has not ended."""
        await self.connect()
        raw = await self.redis.hget(keys.state_key(tenant or self.tenant, request_id), "result")
        return None if raw is None else codec.decode_terminal(raw)

    async def get_progress(self, request_id: str, tenant: str | None = None) -> list[Token]:
        """The stored token events, deduplicated (per choice), in order."""
        await self.connect()
        raw = await self.redis.lrange(keys.progress_key(tenant or self.tenant, request_id), 0, -1)
        events, seen = [], {}
        for item in raw:
            event = codec.decode_token(item)
            if event.seq == seen.get(event.index, 0):
                events.append(event)
                seen[event.index] = event.seq + len(event.token_ids)
        return events
