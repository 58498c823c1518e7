"""The soak's books: every token event counted by ``seq``, on the raw channel and as the
client library delivered it.

An event's ``seq`` is the index of its first token, so a request's events must tile
``[0, n)``. :func:`tally` counts, against the tokens the request should have: positions
never covered (lost), positions covered again (repeated), positions first covered by an
event that arrived after one further on (out of order), and positions whose token differs.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared import codec
from shared.protocol import Token

logger = logging.getLogger(__name__)

CHANNEL_PATTERN = "fleet:req:*:events"
# An outage window opens a little before the listener notices: a message Redis took just
# before it was killed may never have reached the listener's socket.
_WINDOW_LEAD_S = 1.0

SeqEvent = tuple[int, list[int]]  # (seq, token ids)


@dataclass
class Tally:
    lost: int = 0
    repeated: int = 0
    out_of_order: int = 0
    differing: int = 0

    def add(self, other: "Tally") -> None:
        self.lost += other.lost
        self.repeated += other.repeated
        self.out_of_order += other.out_of_order
        self.differing += other.differing


def tally(events: list[SeqEvent], expected: list[int]) -> Tally:
    """How ``events`` (in arrival order) cover ``expected``; see the module docstring."""
    n = len(expected)
    copies = [0] * n
    out = Tally()
    frontier = 0  # one past the furthest position seen so far
    for seq, token_ids in events:
        for pos in range(seq, seq + len(token_ids)):
            token = token_ids[pos - seq]
            if pos >= n or token != expected[pos]:
                out.differing += 1
            if pos >= n:
                continue
            if copies[pos]:
                out.repeated += 1
            elif pos < frontier:
                out.out_of_order += 1
            copies[pos] += 1
        frontier = max(frontier, seq + len(token_ids))
    out.lost = copies.count(0)
    return out


@dataclass
class ChannelRecord:
    """What one request's channel carried, in arrival order."""

    tokens: list[SeqEvent] = field(default_factory=list)
    terminals: list[str] = field(default_factory=list)  # "result" / "failure:<code>"
    terminal_seen: asyncio.Event = field(default_factory=asyncio.Event)


class ChannelListener:
    """One pattern subscription to every request channel, up before any request is sent.

    Its connection never retries silently, so each outage is seen and becomes a window in
    :attr:`outages`: a request alive during one may have lost channel messages for reasons
    pub/sub allows (at-most-once), and is left out of the channel's loss figures.
    """

    def __init__(self, url: str) -> None:
        self.client = aioredis.from_url(url, retry=Retry(NoBackoff(), 0))
        self.records: dict[str, ChannelRecord] = defaultdict(ChannelRecord)
        self.outages: list[tuple[float, float]] = []
        self.undecodable = 0
        self.subscribed = asyncio.Event()

    async def run(self) -> None:
        down_since: float | None = None
        while True:
            pubsub = self.client.pubsub()
            try:
                await pubsub.psubscribe(CHANNEL_PATTERN)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    kind = None if message is None else message.get("type")
                    if kind == "pmessage":
                        self._on_message(message["channel"], message["data"])
                    elif kind == "psubscribe":  # confirmed: from here on nothing is missed
                        if down_since is not None:
                            self.outages.append((down_since - _WINDOW_LEAD_S, time.time()))
                            down_since = None
                        self.subscribed.set()
            except (OSError, ConnectionError, aioredis.ConnectionError, aioredis.TimeoutError):
                if down_since is None:
                    down_since = time.time()
                await asyncio.sleep(0.05)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # the connection is already gone
                    pass

    def _on_message(self, channel: bytes, data: bytes) -> None:
        request_id = channel.decode(errors="replace").split("/", 1)[-1].split("}", 1)[0]
        try:
            event = codec.decode_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.undecodable += 1
            return
        record = self.records[request_id]
        if isinstance(event, Token):
            record.tokens.append((event.seq, list(event.token_ids)))
            return
        record.terminals.append(terminal_kind(event))
        record.terminal_seen.set()

    def overlaps_outage(self, start: float, end: float) -> bool:
        return any(a <= end and start <= b for a, b in self.outages)

    async def close(self) -> None:
        await self.client.aclose()


def terminal_kind(event) -> str:
    code = getattr(event, "code", None)
    return "result" if code is None else f"failure:{code}"
