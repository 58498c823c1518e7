"""Coalescing (``stream_interval_ms``) and the cut PUBLISH/FINISH scripts, with the real
publisher, the real scripts and a real redis-server; the engine is replaced by the reports
it would send, and the client by a raw subscriber applying the client rule (accept an
event only when its ``seq`` is the number of tokens received so far)."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gpu_worker.edge import calls
from gpu_worker.edge.engine_loop import StepReport
from gpu_worker.edge.inflight import Entry, Inflight, resume_state
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.publisher import Publisher
from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.edge.scripts import Begun, Published, RequestKeys
from gpu_worker.edge.state import WorkerState
from gpu_worker.outputs import RequestDelta
from shared import codec, keys
from shared.protocol import Request, Result, Token
from tests.edge.test_publisher_unit import FakeEngine

TENANT = "default"


class Client:
    """One raw subscriber per request channel: every event as received, and what the client
    rule keeps."""

    def __init__(self, url: str) -> None:
        self.redis = aioredis.from_url(url)
        self.pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        self.raw: dict[str, list] = {}

    async def subscribe(self, request_ids) -> None:
        for rid in request_ids:
            self.raw[rid] = []
            await self.pubsub.subscribe(keys.channel(TENANT, rid))
        await self.pubsub.get_message(timeout=0.2)  # the confirmations
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.pubsub.listen():
            if message["type"] == "message":
                event = codec.decode_event(message["data"])
                self.raw[event.request_id].append(event)

    async def settle(self, request_ids, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(any(isinstance(e, Result) for e in self.raw[r]) for r in request_ids):
            assert time.monotonic() < deadline, "no terminal event"
            await asyncio.sleep(0.01)

    def kept(self, rid: str) -> tuple[list[int], str, int]:
        """Tokens and text the client rule keeps, and how many events it dropped."""
        ids, text, dropped = [], "", 0
        for e in self.raw[rid]:
            if isinstance(e, Token):
                if e.seq == len(ids):
                    ids += e.token_ids
                    text += e.text
                else:
                    dropped += 1
        return ids, text, dropped

    def tokens(self, rid: str) -> list[Token]:
        return [e for e in self.raw[rid] if isinstance(e, Token)]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.pubsub.aclose()
        await self.redis.aclose()


async def _begin(io: RedisIO, options: WorkerOptions, rid: str) -> Inflight:
    entry = Entry(stream=keys.stream_key("default", TENANT, "default"), lane="default",
                  entry_id=f"1-{rid}", fields={}, tenant=TENANT)
    begun = Begun.parse(await io.script(*calls.begin(options, TENANT, rid, entry, time.time())[1:]))
    return Inflight(request=Request(request_id=rid, tenant=TENANT, prompt="hi", max_tokens=64),
                    entry=entry, owner=begun.owner, prior_token_ids=[], prior_text="",
                    first_start=begun.first_start, first_token_at=None)


async def _publisher(url: str, interval_ms: int, rids: list[str], io_class=RedisIO):
    """A publisher on the real server, every request in ``rids`` begun and held."""
    options = WorkerOptions(worker_id="w1", stream_interval_ms=interval_ms)
    io = io_class(url)
    await io.detect()
    st = WorkerState(options=options, io=io, engine=FakeEngine())
    for rid in rids:
        inf = await _begin(io, options, rid)
        st.inflight[inf.key] = inf
    return Publisher(st), st, io


def _delta(rid: str, new: list[int], total: int, finished: bool = False) -> RequestDelta:
    return RequestDelta(request_id=f"{TENANT}/{rid}", new_token_ids=new,
                        new_text="".join(f"<{t}>" for t in new), finished=finished,
                        finish_reason="length" if finished else None, num_output_tokens=total)


def _steps(rid: str, n: int, per_step: int = 1) -> list[RequestDelta]:
    out, done = [], 0
    while done < n:
        new = list(range(100 + done, 100 + min(done + per_step, n)))
        done += len(new)
        out.append(_delta(rid, new, done, finished=done == n))
    return out


async def _serve(url: str, interval_ms: int, rids: list[str], n: int, *, step_s: float = 0.004,
                 io_class=RedisIO):
    """Feed one report per engine step through a running publisher; the client's view."""
    client = Client(url)
    await client.subscribe(rids)
    publisher, st, io = await _publisher(url, interval_ms, rids, io_class)
    task = asyncio.create_task(publisher.run())
    per_request = {rid: _steps(rid, n, per_step=1 + i) for i, rid in enumerate(rids)}
    for step in range(max(len(d) for d in per_request.values())):
        publisher.on_report(StepReport(deltas=[d[step] for d in per_request.values() if step < len(d)]))
        await asyncio.sleep(step_s)
    await client.settle(rids)
    # The terminal event can reach the client before the publisher has booked the FINISH
    # script's reply (seen on a loaded machine): let it, rather than cancel it half-way.
    deadline = time.monotonic() + 5
    while st.inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.close()
    stored = {}
    for rid in rids:
        rk = RequestKeys.of(TENANT, rid)
        stored[rid] = (resume_state(await io.client.lrange(rk.progress, 0, -1)),
                       await io.client.llen(rk.progress))
    await io.close()
    return client, stored, st


def test_clients_receive_identical_tokens_with_and_without_coalescing(redis_server):
    rids = ["a", "b"]
    views = {}
    for interval in (0, 25):
        # fresh request ids per run: the same ids would be 'done' already
        run_ids = [f"{r}{interval}" for r in rids]
        client, stored, st = asyncio.run(_serve(redis_server.url, interval, run_ids, 40))
        views[interval] = {}
        for rid, run_id in zip(rids, run_ids):
            ids, text, dropped = client.kept(run_id)
            assert dropped == 0  # nothing twice, nothing out of order on the channel
            result = next(e for e in client.raw[run_id] if isinstance(e, Result))
            assert result.token_ids == ids and result.text == text
            (stored_ids, stored_text), num_events = stored[run_id]
            assert (stored_ids, stored_text) == (ids, text)  # what a resuming worker reads
            views[interval][rid] = (ids, text, len(client.tokens(run_id)))
        assert st.num_finished == 2 and not st.inflight
    for rid in rids:
        assert views[0][rid][:2] == views[25][rid][:2]
        assert views[25][rid][2] < views[0][rid][2]  # fewer, larger events
    assert views[0]["a"][2] == 40  # interval 0: one event per engine step


def test_first_token_and_terminal_are_not_delayed(redis_server):
    async def main():
        publisher, st, io = await _publisher(redis_server.url, 60_000, ["q"])  # nothing falls due
        inf = st.inflight[f"{TENANT}/q"]
        progress = RequestKeys.of(TENANT, "q").progress

        async def stored():
            return [codec.decode_token(raw) for raw in await io.client.lrange(progress, 0, -1)]

        await publisher.publish([StepReport(deltas=[_delta("q", [1], 1)])])
        first = await stored()
        assert [(e.seq, e.token_ids) for e in first] == [(0, [1])]  # at once
        assert inf.first_token_at is not None
        await publisher.publish([StepReport(deltas=[_delta("q", [2], 2)])])
        await publisher.publish([StepReport(deltas=[_delta("q", [3], 3)])])
        assert len(await stored()) == 1  # held: the interval has not passed
        await publisher.publish([StepReport(deltas=[_delta("q", [4], 4, finished=True)])])
        events = await stored()
        assert [(e.seq, e.token_ids) for e in events] == [(0, [1]), (1, [2, 3, 4])]
        state = RequestKeys.of(TENANT, "q").state
        assert codec.decode_terminal(await io.client.hget(state, "result")).token_ids == [1, 2, 3, 4]
        assert st.num_finished == 1
        await io.close()

    asyncio.run(main())


def test_held_tokens_go_out_when_the_interval_passes_without_another_step(redis_server):
    async def main():
        publisher, st, io = await _publisher(redis_server.url, 50, ["slow"])
        task = asyncio.create_task(publisher.run())
        publisher.on_report(StepReport(deltas=[_delta("slow", [1], 1)]))
        publisher.on_report(StepReport(deltas=[_delta("slow", [2], 2)]))
        await asyncio.sleep(0.01)
        publisher.on_report(StepReport(deltas=[_delta("slow", [3], 3)]))  # then the engine stalls
        progress = RequestKeys.of(TENANT, "slow").progress
        deadline = time.monotonic() + 2
        while await io.client.llen(progress) < 2:
            assert time.monotonic() < deadline, "held tokens never went out"
            await asyncio.sleep(0.005)
        ids, _ = resume_state(await io.client.lrange(progress, 0, -1))
        assert ids == [1, 2, 3]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await io.close()

    asyncio.run(main())


class LosesFirstReply(RedisIO):
    """Runs every pipeline, but the reply of the first one holding a token event is lost
    (the connection drops after the server applied it): the publisher must retry it."""

    lost = False

    async def run(self, batch):
        answers = await super().run(batch)
        if not LosesFirstReply.lost and any(c[:2] == ("script", "publish") for c in batch):
            LosesFirstReply.lost = True
            raise RedisConnectionError("connection lost after the write")
        return answers


def test_a_retried_coalesced_event_is_stored_and_delivered_once(redis_server, monkeypatch):
    async def no_sleep(self):
        await asyncio.sleep(0)

    monkeypatch.setattr("gpu_worker.edge.redis_io.Backoff.sleep", no_sleep)
    LosesFirstReply.lost = False
    client, stored, st = asyncio.run(_serve(redis_server.url, 20, ["r"], 30, io_class=LosesFirstReply))
    assert LosesFirstReply.lost
    ids, _, dropped = client.kept("r")
    assert ids == list(range(100, 130)) and dropped == 0
    assert len(client.tokens("r")) == stored["r"][1]  # each stored event published once
    assert stored["r"][0][0] == ids and st.num_finished == 1


def test_publish_runs_fewer_commands_and_keeps_the_ttls(redis_server):
    async def main():
        options = WorkerOptions(worker_id="w1", result_ttl_s=100)
        io = RedisIO(redis_server.url)
        await io.detect()
        inf = await _begin(io, options, "t")
        rk = RequestKeys.of(TENANT, "t")

        async def publish(seq, ids, first=None, owner=None):
            event = Token(request_id="t", seq=seq, token_ids=ids, text="x" * len(ids))
            call = calls.publish(options, io.publish_command, inf, event, first)
            if owner is not None:
                call[3][0] = owner
            return await io.script(*call[1:])

        await io.client.config_resetstat()
        assert await publish(0, [1], first=123.5) == Published.OK
        assert await io.client.pttl(rk.progress) > 99_000  # set when the list is created
        await io.client.pexpire(rk.state, 80_000)  # as if 20 s had passed: renewed together
        await io.client.pexpire(rk.progress, 80_000)
        assert await publish(1, [2, 3]) == Published.OK
        assert await io.client.pttl(rk.state) > 99_000 and await io.client.pttl(rk.progress) > 99_000
        await io.client.pexpire(rk.state, 95_000)  # within a tenth: not renewed
        assert await publish(3, [4]) == Published.OK
        assert await io.client.pttl(rk.state) <= 95_000
        assert await publish(3, [4]) == Published.DUPLICATE
        assert await publish(5, [6]) == Published.GAP
        assert await publish(4, [5], owner="w9#9") == Published.FENCED
        await io.client.set(rk.cancel, 1)
        assert await publish(4, [5]) == Published.CANCEL_ASKED
        stats = await io.client.info("commandstats")
        assert stats["cmdstat_hmget"]["calls"] == 7 and "cmdstat_hget" not in stats
        # the scripts': events 2-4 (the first created the list); then the test's own four
        assert stats["cmdstat_pttl"]["calls"] == 3 + 4
        assert stats["cmdstat_pexpire"]["calls"] == 2 + 2 + 3  # created, renewed once; the test's
        assert await io.client.hget(rk.state, "first_token_at") == b"123.5"
        assert await io.client.hget(rk.state, "published") == b"5"
        await io.close()

    asyncio.run(main())


class RecordingIO:
    """Answers every write as stored; logs the calls in order."""

    publish_command = "PUBLISH"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def run(self, batch):
        self.calls.extend(batch)
        return [Published.OK if c[:2] == ("script", "publish") else 1 for c in batch]

    def kinds(self) -> list[str]:
        return [c[1] if c[0] == "script" else c[0] for c in self.calls]

    def events(self) -> list[tuple[int, list[int]]]:
        out = []
        for c in self.calls:
            if c[:2] == ("script", "publish"):
                event = codec.decode_token(c[3][3])
                out.append((event.seq, event.token_ids))
        return out


def _held_state() -> tuple[WorkerState, Publisher, RecordingIO, Inflight]:
    io = RecordingIO()
    st = WorkerState(options=WorkerOptions(worker_id="w1", stream_interval_ms=60_000), io=io,
                     engine=FakeEngine())
    entry = Entry(stream=keys.stream_key("default", TENANT, "default"), lane="default",
                  entry_id="1-0", fields={}, tenant=TENANT)
    inf = Inflight(request=Request(request_id="h", tenant=TENANT, prompt="hi", max_tokens=64),
                   entry=entry, owner="w1#1", prior_token_ids=[], prior_text="", first_start=1.0,
                   first_token_at=None)
    st.inflight[inf.key] = inf
    publisher = Publisher(st)
    for n in (1, 2, 3):  # the first goes out at once; 2 and 3 are held
        asyncio.run(publisher.publish([StepReport(deltas=[_delta("h", [n], n)])]))
    assert io.events() == [(0, [1])]
    return st, publisher, io, inf


def test_a_failure_publishes_the_held_tokens_before_it():
    st, publisher, io, inf = _held_state()
    asyncio.run(publisher.publish([StepReport(failures=[(inf.key, "internal", "boom")])]))
    assert io.events() == [(0, [1]), (1, [2, 3])]
    assert io.kinds() == ["publish", "publish", "finish", "XADD", "ack"]


def test_requests_given_back_publish_their_held_tokens_first():
    st, publisher, io, inf = _held_state()
    asyncio.run(publisher.publish([StepReport(released=[inf.key])]))  # the engine broke
    assert io.events() == [(0, [1]), (1, [2, 3])] and io.kinds()[-1] == "handoff"

    st, publisher, io, inf = _held_state()
    inf.handoff = True  # draining: the engine stopped it for a hand-back
    done = RequestDelta(request_id=inf.key, new_token_ids=[], new_text="", finished=True,
                        finish_reason="handoff", num_output_tokens=3)
    asyncio.run(publisher.publish([StepReport(deltas=[done])]))
    assert io.events() == [(0, [1]), (1, [2, 3])] and io.kinds()[-1] == "handoff"

    st, publisher, io, inf = _held_state()
    asyncio.run(publisher.flush())  # the worker's last flush while draining
    assert io.events() == [(0, [1]), (1, [2, 3])]


def test_a_fenced_request_publishes_nothing_it_held():
    st, publisher, io, inf = _held_state()
    st.lose(inf.key, "lease taken over")
    asyncio.run(publisher.flush())  # would publish anything still held
    assert io.events() == [(0, [1])]
