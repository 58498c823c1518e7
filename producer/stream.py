"""One submitted request as the client sees it: tokens in order, exactly once, then a result."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
from redis.exceptions import RedisError
import redis.asyncio as aioredis

from producer.errors import RequestFailed
from producer.subscriptions import RECONNECTED
from shared import codec, keys
from shared.protocol import Failure, Result, Token

logger = logging.getLogger(__name__)


class RequestStream:
    """``async for token in stream`` yields :class:`Token` events with no gap, repeat or
    reordering (duplicates dropped by ``seq``; gaps filled from the stored progress); then
    ``await stream.result()`` returns the :class:`Result` or raises :class:`RequestFailed`.

    If nothing arrives for ``poll_s`` the stored progress and result are read, so a lost
    final event or a lost subscription never hangs a client.
    """

    def __init__(self, client: aioredis.Redis, queue: asyncio.Queue, *, tenant: str,
                 request_id: str, poll_s: float, on_close) -> None:
        self.tenant = tenant
        self.request_id = request_id
        self.token_ids: list[int] = []
        self.text = ""
        self._client = client
        self._queue = queue
        self._poll_s = poll_s
        self._on_close = on_close
        self._terminal: Result | Failure | None = None
        self._ready: list[Token] = []

    def __aiter__(self) -> AsyncIterator[Token]:
        return self._tokens()

    async def _tokens(self) -> AsyncIterator[Token]:
        try:
            while True:
                while self._ready:
                    yield self._ready.pop(0)
                if self._terminal is not None:
                    return
                await self._next_event()
        finally:
            if self._terminal is not None:
                await self._on_close(self)

    async def result(self, timeout: float | None = None) -> Result:
        """Wait for the end (consuming any tokens not yet iterated)."""
        async def drain() -> None:
            async for _ in self:
                pass
        await asyncio.wait_for(drain(), timeout)
        if isinstance(self._terminal, Failure):
            raise RequestFailed(self._terminal)
        assert isinstance(self._terminal, Result)
        return self._terminal

    async def close(self) -> None:
        """Stop listening (the request itself goes on); for a stream no one will read."""
        await self._on_close(self)

    @property
    def done(self) -> bool:
        """True once the terminal event is known (tokens may still be left to iterate)."""
        return self._terminal is not None

    @property
    def next_seq(self) -> int:
        return len(self.token_ids)

    async def _next_event(self) -> None:
        try:
            raw = await asyncio.wait_for(self._queue.get(), self._poll_s)
        except asyncio.TimeoutError:
            raw = RECONNECTED
        if raw is RECONNECTED:
            await self._try_recover()
            return
        try:
            event = codec.decode_event(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            logger.warning("dropping an undecodable event on %s", self.request_id)
            return
        if isinstance(event, Token):
            if event.seq > self.next_seq:  # a gap: the stored progress has what we missed
                await self._try_recover()
            self._take(event)
        else:
            if len(event.token_ids if isinstance(event, Result) else []) > self.next_seq:
                await self._try_recover()
                if len(event.token_ids) > self.next_seq and self._terminal is None:
                    return  # tokens still missing: the next poll reads them and the result
            self._end(event)

    def _take(self, event: Token) -> None:
        if event.seq != self.next_seq:
            return  # already seen (or, after a failed recovery, still missing)
        self.token_ids.extend(event.token_ids)
        self.text += event.text
        self._ready.append(event)

    async def _try_recover(self) -> None:
        """:meth:`recover`, or nothing while Redis is failing over (the next poll retries;
        redis-py's cluster client can also raise AttributeError/RuntimeError on a
        connection torn down mid-failover)."""
        try:
            await self.recover()
        except (RedisError, OSError, AttributeError, RuntimeError) as exc:
            logger.info("cannot read the stored progress of %s yet: %r", self.request_id, exc)

    async def recover(self) -> None:
        """Fill from the durable progress and result (what pub/sub may have dropped)."""
        # Two plain commands (each retried through a cluster failover by the client), not
        # a pipeline: redis-py's cluster pipeline does not survive a node going away.
        progress, stored = await asyncio.gather(
            self._client.lrange(keys.progress_key(self.tenant, self.request_id), 0, -1),
            self._client.hget(keys.state_key(self.tenant, self.request_id), "result"))
        for raw in progress:
            self._take(codec.decode_token(raw))
        if stored is not None and self._terminal is None:
            self._end(codec.decode_terminal(stored))

    def _end(self, event: Result | Failure) -> None:
        """The terminal event. The result is authoritative: tokens it holds that no event
        brought (stored events lost with a Redis failover, say) are delivered from it."""
        if isinstance(event, Result) and len(event.token_ids) > self.next_seq \
                and event.token_ids[:self.next_seq] == self.token_ids:
            tail_text = event.text[len(self.text):] if event.text.startswith(self.text) else ""
            self._take(Token(request_id=self.request_id, seq=self.next_seq,
                             token_ids=event.token_ids[self.next_seq:], text=tail_text))
        self._terminal = event
