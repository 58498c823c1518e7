"""The soak's traffic: valid requests through the project's own client library, raw
invalid entries beside them, and short probes that time the fleet's recovery.

Valid requests are greedy with ``ignore_eos`` and a fixed ``max_tokens``, so each answer
must equal a prefix of its prompt's reference. Every call that may meet a Redis outage is
retried with the same request id (the idempotency key), so an outage never makes a
request look unanswered; submissions pass a :class:`Gate` the fault injector closes
around a Redis restart, so no entry is sent without knowing whether it arrived.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import redis.exceptions

from gpu_worker.bench.soak_invalid import KINDS, invalid_entry
from gpu_worker.bench.soak_ledger import ChannelListener, SeqEvent, terminal_kind
from producer import AsyncFleetClient, RequestFailed
from shared import codec, keys
from shared.protocol import Request, Result

logger = logging.getLogger(__name__)

TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError,
             OSError, asyncio.TimeoutError)
PROBE_TOKENS = 4


class Gate:
    """Open while Redis is known to be up; ``close()`` waits for calls already inside."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._inside = 0

    async def __aenter__(self) -> None:
        await self._open.wait()
        self._inside += 1

    async def __aexit__(self, *exc: object) -> None:
        self._inside -= 1

    async def wait_open(self) -> None:
        await self._open.wait()

    async def close(self, timeout_s: float = 10.0) -> None:
        self._open.clear()
        deadline = time.monotonic() + timeout_s
        while self._inside and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def open(self) -> None:
        self._open.set()


@dataclass
class ValidRecord:
    request: Request
    prompt_index: int
    probe: bool
    sent_at: float  # Unix seconds
    views: list[list[SeqEvent]] = field(default_factory=list)  # one per client stream used
    enqueued: bool = False
    result: Result | None = None
    failure: str | None = None
    timed_out: bool = False
    done_at: float | None = None
    retries: int = 0


@dataclass
class InvalidRecord:
    kind: str
    request_id: str
    codes: frozenset  # failure codes the client may get; empty: unaddressable
    entry_id: str
    sent_at: float
    stored: str | None = None  # the stored terminal event: "result" or "failure:<code>"
    checked_at: float | None = None


class Traffic:
    def __init__(self, url: str, gate: Gate, listener: ChannelListener, prompts: list[list[int]],
                 *, seed: int, concurrency: int, invalid_share: float, max_tokens: tuple[int, int],
                 request_timeout_s: float) -> None:
        self.fleet = AsyncFleetClient(url)
        self.raw = aioredis.from_url(url)
        self.gate, self.listener, self.prompts = gate, listener, prompts
        self.rng = random.Random(seed)
        self.concurrency = concurrency
        self.invalid_per_valid = min(invalid_share, 0.95) / (1.0 - min(invalid_share, 0.95))
        self.max_tokens = max_tokens
        self.request_timeout_s = request_timeout_s
        self.valid: list[ValidRecord] = []
        self.invalid: list[InvalidRecord] = []
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()

    async def run(self, stop_at: float) -> None:
        """Keep ``concurrency`` valid requests in flight until ``stop_at`` (monotonic),
        adding invalid entries in proportion."""
        slots = asyncio.Semaphore(self.concurrency)
        credit = 0.0
        while time.monotonic() < stop_at:
            try:
                await asyncio.wait_for(slots.acquire(), max(stop_at - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                break
            task = self._spawn(self.serve(self._new_valid()))
            task.add_done_callback(lambda _: slots.release())
            credit += self.invalid_per_valid
            while credit >= 1.0:
                credit -= 1.0
                await self._send_invalid()

    async def probe(self) -> float | None:
        """Serve one short high-lane request; its completion time (Unix s), or None."""
        record = self._new_valid(probe=True)
        await self.serve(record)
        return record.done_at if record.result is not None else None

    async def finish(self, timeout_s: float) -> int:
        """Wait for every request and check; the number still unfinished at the timeout."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        unfinished = [t for t in self._tasks if not t.done()]
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        await asyncio.gather(*(self._read_stored(r) for r in self.invalid
                               if r.codes and r.stored is None))
        return len(unfinished)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.fleet.close()
        await self.raw.aclose()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _new_valid(self, probe: bool = False) -> ValidRecord:
        index = 0 if probe else self.rng.randrange(len(self.prompts))
        num = PROBE_TOKENS if probe else self.rng.randint(*self.max_tokens)
        request = self.fleet.make_request(
            request_id=f"{'probe' if probe else 'valid'}-{next(self._ids)}",
            prompt_token_ids=self.prompts[index], max_tokens=num, temperature=0.0,
            ignore_eos=True, priority="high" if probe else "default")
        record = ValidRecord(request, index, probe, time.time())
        self.valid.append(record)
        return record

    async def serve(self, record: ValidRecord) -> None:
        """One valid request to its end, within ``request_timeout_s``."""
        try:
            await asyncio.wait_for(self._serve(record), self.request_timeout_s)
        except asyncio.TimeoutError:
            record.timed_out = True
        record.done_at = time.time()

    async def _serve(self, record: ValidRecord) -> None:
        while True:
            try:
                if record.enqueued:
                    stream = await self.fleet.watch(record.request.request_id)
                else:
                    async with self.gate:
                        stream = await self.fleet.submit(record.request)
                    record.enqueued = True
                view: list[SeqEvent] = []
                record.views.append(view)
                async for token in stream:
                    view.append((token.seq, list(token.token_ids)))
                record.result = await stream.result()
                return
            except RequestFailed as exc:
                record.failure = exc.code
                return
            except TRANSIENT as exc:
                record.retries += 1
                logger.debug("request %s: %r; watching again", record.request.request_id, exc)
                await self.gate.wait_open()
                await asyncio.sleep(0.1)

    async def _send_invalid(self) -> None:
        kind = self.rng.choice(sorted(KINDS))
        request_id = f"bad-{next(self._ids)}"
        fields, codes = invalid_entry(kind, self.rng, request_id)
        stream = keys.stream_key("default", "default", "default")
        for _ in range(50):
            try:
                async with self.gate:
                    entry_id = await self.raw.xadd(stream, fields)
                break
            except TRANSIENT:
                await asyncio.sleep(0.1)
        else:
            logger.warning("could not send an invalid entry (%s)", kind)
            return
        record = InvalidRecord(kind, request_id, codes, entry_id.decode(), time.time())
        self.invalid.append(record)
        if codes:
            self._spawn(self._check_invalid(record))

    async def _check_invalid(self, record: InvalidRecord) -> None:
        """Wait for its terminal event on the channel, then read what is stored."""
        seen = self.listener.records[record.request_id].terminal_seen
        try:
            await asyncio.wait_for(seen.wait(), self.request_timeout_s)
        except asyncio.TimeoutError:
            pass
        await self._read_stored(record)

    async def _read_stored(self, record: InvalidRecord) -> None:
        state = keys.state_key("default", record.request_id)
        for _ in range(100):
            try:
                raw = await self.raw.hget(state, "result")
                break
            except TRANSIENT:
                await self.gate.wait_open()
                await asyncio.sleep(0.1)
        else:
            return
        record.checked_at = time.time()
        if raw is not None:
            record.stored = terminal_kind(codec.decode_terminal(raw))
