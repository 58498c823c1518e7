"""The clients of ``fleet bench edge``: a steady number of requests in flight, each
subscribed to its channel before it is enqueued, every event checked as it arrives.

One pub/sub connection per Redis node (sharded pub/sub on a cluster, each channel on the
node owning its slot), read by one task that checks events inline: a token event is kept
only when its ``seq`` is the number of tokens received so far (the client rule), and its
tokens must be the synthetic engine's (:func:`~gpu_worker.bench.edge_engine.expected_tokens`).
Anything else is counted, never hidden: repeated, out of order (a gap), differing tokens,
terminal events missing or wrong.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.crc import key_slot

from gpu_worker.bench.edge_engine import age_ms, expected_tokens
from shared import codec, keys
from shared.protocol import Request, Result, Token

logger = logging.getLogger(__name__)

TENANT = keys.DEFAULT_TENANT


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    received: int = 0
    done: bool = False


@dataclass
class Books:
    """What the clients saw; ``window_*``: inside the measured window only."""

    requests_done: int = 0
    tokens: int = 0
    events: int = 0
    repeated: int = 0
    gaps: int = 0
    differing: int = 0
    bad_results: int = 0
    window_tokens: int = 0
    window_events: int = 0
    ages_ms: list[int] = field(default_factory=list)
    in_window: bool = False

    @property
    def correct(self) -> bool:
        return not (self.repeated or self.gaps or self.differing or self.bad_results)


class _Node:
    """One pub/sub connection; ``subscribe`` returns once the server confirmed."""

    def __init__(self, port: int, sharded: bool, on_message) -> None:
        self.client = aioredis.Redis(host="127.0.0.1", port=port)
        self.pubsub = self.client.pubsub()
        self.sharded, self.on_message = sharded, on_message
        self.confirm: dict[str, asyncio.Future] = {}
        self.task: asyncio.Task | None = None
        self.lock = asyncio.Lock()

    async def subscribe(self, channel: str) -> None:
        done = asyncio.get_running_loop().create_future()
        self.confirm[channel] = done
        async with self.lock:  # the first call connects: concurrent ones would each connect
            await (self.pubsub.ssubscribe if self.sharded else self.pubsub.subscribe)(channel)
        if self.task is None:
            self.task = asyncio.create_task(self._read())
        await asyncio.wait_for(done, 10)

    async def unsubscribe(self, channel: str) -> None:
        await (self.pubsub.sunsubscribe if self.sharded else self.pubsub.unsubscribe)(channel)

    async def _read(self) -> None:
        try:
            await self._read_until_cancelled()
        except Exception:  # the run then times out and says so
            logger.exception("the bench's pub/sub reader failed")
            raise

    async def _read_until_cancelled(self) -> None:
        while True:
            message = await self.pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            kind, channel = message["type"], message["channel"].decode()
            if kind in ("message", "smessage"):
                self.on_message(channel, message["data"])
            elif kind in ("subscribe", "ssubscribe") and channel in self.confirm:
                self.confirm.pop(channel).set_result(None)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.pubsub.aclose()
        await self.client.aclose()


class Traffic:
    """Keeps ``concurrency`` requests of ``max_tokens`` tokens in flight until stopped."""

    def __init__(self, node_ports: list[int], slot_owner, *, model: str, concurrency: int,
                 max_tokens: int, cluster: bool) -> None:
        self.model = model
        self.concurrency, self.max_tokens = concurrency, max_tokens
        self.slot_owner = slot_owner  # slot -> index into node_ports
        self.nodes = [_Node(p, cluster, self._on_message) for p in node_ports]
        self.books = Books()
        self.live: dict[str, _Request] = {}
        self._all_done = asyncio.Event()
        self._submitting = True
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        # A plain client to the node owning the stream's slot: the bench knows the slots,
        # and redis-py's cluster client races when it connects under concurrent commands.
        self.stream = keys.stream_key(self.model, TENANT, "default")
        self.redis = self._node(self.stream).client
        await asyncio.gather(*(self._submit(i) for i in range(self.concurrency)))

    def _node(self, channel: str) -> _Node:
        return self.nodes[self.slot_owner(key_slot(channel.encode()))]

    async def _submit(self, n: int) -> None:
        rid = uuid.uuid4().hex
        req = _Request(rid, [1 + n % 30_000], self.max_tokens)
        self.live[keys.channel(TENANT, rid)] = req
        channel = keys.channel(TENANT, rid)
        await self._node(channel).subscribe(channel)
        payload = codec.encode(Request(request_id=rid, tenant=TENANT, prompt_token_ids=req.prompt_ids,
                                       max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True))
        await self.redis.xadd(self.stream, {keys.STREAM_FIELD: payload})

    def _on_message(self, channel: str, data: bytes) -> None:
        req = self.live.get(channel)
        if req is None or req.done:
            return
        event = codec.decode_event(data)
        if isinstance(event, Token):
            self._on_token(req, event)
        else:
            self._on_terminal(channel, req, event)

    def _on_token(self, req: _Request, event: Token) -> None:
        b = self.books
        b.events += 1
        n = len(event.token_ids)
        if event.seq < req.received:
            b.repeated += 1
            return
        if event.seq > req.received:
            b.gaps += 1
            return
        if event.token_ids != expected_tokens(req.prompt_ids, event.seq, event.seq + n):
            b.differing += 1
        req.received += n
        b.tokens += n
        if b.in_window:
            b.window_tokens += n
            b.window_events += 1
            b.ages_ms.extend(age_ms(event.text, time.time()))

    def _on_terminal(self, channel: str, req: _Request, event) -> None:
        req.done = True
        ok = (isinstance(event, Result) and event.finish_reason == "length"
              and req.received == req.max_tokens
              and event.token_ids == expected_tokens(req.prompt_ids, 0, req.max_tokens))
        if not ok:
            self.books.bad_results += 1
            logger.error("request %s ended wrong: %r", req.request_id, event)
        self.books.requests_done += 1
        del self.live[channel]
        self._spawn(self._node(channel).unsubscribe(channel))
        if self._submitting:
            self._spawn(self._submit(self.books.requests_done + self.concurrency))
        elif not self.live:
            self._all_done.set()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, timeout: float) -> bool:
        """Stop submitting; wait for every request in flight to end. False on timeout."""
        self._submitting = False
        if not self.live:
            return True
        try:
            await asyncio.wait_for(self._all_done.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for node in self.nodes:
            await node.close()
