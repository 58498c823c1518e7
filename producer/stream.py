"""One submitted request as the client sees it: tokens in order, exactly once, then a result."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
from redis.exceptions import RedisError
import redis.asyncio as aioredis

from producer.errors import failure_error
from producer.subscriptions import RECONNECTED
from shared import codec, errors, keys
from shared.protocol import Failure, Result, Token
from shared.results import all_choices

logger = logging.getLogger(__name__)


class RequestStream:
    """``async for token in stream`` yields :class:`Token` events with no gap, repeat or
    reordering (duplicates dropped by ``seq``; gaps filled from the stored progress); then
    ``await stream.result()`` returns the :class:`Result` or raises :class:`RequestFailed`.

    If nothing arrives for ``poll_s`` the stored progress and result are read, so a lost
    final event or a lost subscription never hangs a client.
    """

    def __init__(self, client: aioredis.Redis, queue: asyncio.Queue, *, tenant: str,
                 request_id: str, poll_s: float, on_close, digest: str | None = None) -> None:
        self.tenant = tenant
        self.request_id = request_id
        self.choice_token_ids: dict[int, list[int]] = {0: []}  # per choice (``Token.index``)
        self.choice_text: dict[int, str] = {0: ""}
        self.entry_ref: str | None = None  # ``<stream>|<entry id>`` once enqueued by this client
        self._digest = digest  # this client's request (None: a watcher, nothing to compare)
        self._verified = digest is None
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
            raise failure_error(self._terminal)
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
    def token_ids(self) -> list[int]:
        """Choice 0's tokens so far (the only choice unless the request has ``n > 1``)."""
        return self.choice_token_ids[0]

    @property
    def text(self) -> str:
        return self.choice_text[0]

    @property
    def next_seq(self) -> int:
        return len(self.token_ids)

    def _next(self, index: int) -> int:
        return len(self.choice_token_ids.get(index, ()))

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
        if not self._verified:  # the id's stored digest says whether these events are ours
            await self._try_recover()
            if not self._verified:
                return  # unreadable now, or another request's: the next poll decides
        if isinstance(event, Token):
            if event.seq > self._next(event.index):  # a gap: the stored progress has it
                await self._try_recover()
            self._take(event)
        elif self._terminal is None:
            if self._missing(event):
                await self._try_recover()
                if self._missing(event) and self._terminal is None:
                    return  # tokens still missing: the next poll reads them and the result
            self._end(event)

    def _missing(self, event: Result | Failure) -> bool:
        """Whether the result holds tokens of some choice that no event brought yet."""
        if not isinstance(event, Result):
            return False
        return any(len(c.token_ids) > self._next(c.index) for c in all_choices(event))

    def _take(self, event: Token) -> None:
        if event.seq != self._next(event.index):
            return  # already seen (or, after a failed recovery, still missing)
        self.choice_token_ids.setdefault(event.index, []).extend(event.token_ids)
        self.choice_text[event.index] = self.choice_text.get(event.index, "") + event.text
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
        # HGETs, not HMGET: the shipped ACL users (producer, gateway, tenants) may HGET only.
        state = keys.state_key(self.tenant, self.request_id)
        fields = ["result"] + (["digest", f"conflict:{self.entry_ref or ''}"] if self._digest else [])
        progress, stored, *checks = await asyncio.gather(
            self._client.lrange(keys.progress_key(self.tenant, self.request_id), 0, -1),
            *(self._client.hget(state, f) for f in fields))
        digest, conflict = checks or (None, None)
        if self._terminal is not None:
            return
        if self._digest is not None and (conflict is not None or (
                digest is not None and digest.decode() != self._digest)):
            self._terminal = codec.decode_terminal(conflict) if conflict is not None else Failure(
                request_id=self.request_id, code=errors.ID_CONFLICT,
                message="this request id holds a different request; use a fresh id")
            return
        if digest is not None or progress or stored is not None:
            self._verified = True  # a worker began it (an older worker stores no digest)
        for raw in progress:
            self._take(codec.decode_token(raw))
        if stored is not None:
            self._end(codec.decode_terminal(stored))

    def _end(self, event: Result | Failure) -> None:
        """The terminal event. The result is authoritative: tokens it holds that no event
        brought (stored events lost with a Redis failover, say) are delivered from it."""
        for c in all_choices(event) if isinstance(event, Result) else ():
            have, text = self.choice_token_ids.get(c.index, []), self.choice_text.get(c.index, "")
            if len(c.token_ids) > len(have) and c.token_ids[:len(have)] == have:
                tail_text = c.text[len(text):] if c.text.startswith(text) else ""
                self._take(Token(request_id=self.request_id, seq=len(have), index=c.index,
                                 token_ids=c.token_ids[len(have):], text=tail_text))
        self._terminal = event

