"""The publisher in-process, against a fake Redis IO: refused writes are retried in order
and never dropped; each typed script reply does what it says."""
from __future__ import annotations

import asyncio

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError

from gpu_worker.edge.engine_loop import StepReport
from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.publisher import Publisher
from gpu_worker.edge.redis_errors import Kind
from gpu_worker.edge.scripts import Finished, Published
from gpu_worker.edge.state import WorkerState
from gpu_worker.outputs import RequestDelta
from shared import keys
from shared.protocol import Request


class FakeEngine:
    def __init__(self) -> None:
        self.aborted: list[tuple[str, str]] = []

    def abort(self, key: str, reason: str) -> None:
        self.aborted.append((key, reason))


class ScriptedIO:
    """``answer(call, attempt)`` decides each reply; every call is logged with its attempt."""

    publish_command = "PUBLISH"

    def __init__(self, answer) -> None:
        self.answer = answer
        self.log: list[tuple] = []
        self.attempts: dict[tuple, int] = {}

    async def run(self, calls):
        out = []
        for call in calls:
            key = repr(call)
            n = self.attempts.get(key, 0)
            self.attempts[key] = n + 1
            reply = self.answer(call, n)
            if isinstance(reply, type) and issubclass(reply, BaseException):
                raise reply("connection lost")
            self.log.append((call, reply))
            out.append(reply)
        return out

    def applied(self, script: str) -> list[tuple]:
        return [c for c, r in self.log if c[:2] == ("script", script)
                and not isinstance(r, Exception)]


def _state(io) -> WorkerState:
    options = WorkerOptions(worker_id="w1")
    st = WorkerState(options=options, io=io, engine=FakeEngine())
    request = Request(request_id="r", prompt="hi", max_tokens=8)
    entry = Entry(stream=keys.stream_key("default", "default", "default"), lane="default", entry_id="1-0",
                  fields={})
    inf = Inflight(request=request, entry=entry, owner="w1#1", prior_token_ids=[],
                   prior_text="", first_start=1.0, first_token_at=None)
    st.inflight[inf.key] = inf
    return st


def _report(*deltas) -> StepReport:
    return StepReport(deltas=list(deltas))


def _delta(new, total, finished=False) -> RequestDelta:
    return RequestDelta(request_id="default/r", new_token_ids=new, new_text="x" * len(new),
                        finished=finished, finish_reason="length" if finished else None,
                        num_output_tokens=total)


def _publish(st, *reports) -> None:
    asyncio.run(_drive(st, reports))


async def _drive(st, reports):
    publisher = Publisher(st)
    for report in reports:  # one batch per report
        await publisher.publish([report])


def _ok(call, attempt):
    if call[:2] == ("script", "publish"):
        return Published.OK
    if call[:2] == ("script", "finish"):
        return Finished.STORED
    return 1


def test_refused_writes_are_retried_in_order_until_stored(monkeypatch):
    monkeypatch.setattr("gpu_worker.edge.redis_io.Backoff.sleep", _no_sleep)

    def answer(call, attempt):
        if call[:2] == ("script", "publish") and call[3][5] == 2 and attempt < 3:
            return OutOfMemoryError("command not allowed")  # the second event, refused 3 times
        if call[:2] == ("script", "publish") and call[3][5] == 3 and attempt < 3:
            return Published.GAP  # what the script says while the second is not stored
        return _ok(call, attempt)

    io = ScriptedIO(answer)
    st = _state(io)
    _publish(st, _report(_delta([1, 2], 2), _delta([3], 3), _delta([4], 4, finished=True)))
    stored = [c[3][5] for c, r in io.log if c[:2] == ("script", "publish") and r == Published.OK]
    assert stored == [0, 2, 3]  # each event stored once, in order
    assert [r for c, r in io.log if c[:2] == ("script", "finish")][-1] == Finished.STORED
    assert io.applied("ack") and not st.inflight and st.num_finished == 1
    assert st.redis.problem is None  # cleared by the writes that went through


def test_a_lost_connection_is_retried_and_nothing_is_dropped(monkeypatch):
    monkeypatch.setattr("gpu_worker.edge.redis_io.Backoff.sleep", _no_sleep)
    failures = iter([True, True, False])

    def answer(call, attempt):
        if call[:2] == ("script", "publish") and next(failures, False):
            return RedisConnectionError
        return _ok(call, attempt)

    io = ScriptedIO(answer)
    st = _state(io)
    _publish(st, _report(_delta([1], 1, finished=True)))
    assert [c[3][5] for c, r in io.log if c[:2] == ("script", "publish")] == [0]
    assert st.num_finished == 1


def test_fenced_stops_the_request_here():
    io = ScriptedIO(lambda call, attempt: Published.FENCED if call[1] == "publish" else _ok(call, attempt))
    st = _state(io)
    _publish(st, _report(_delta([1], 1)))
    assert not st.inflight and st.engine.aborted == [("default/r", "fenced")]


def test_cancel_asked_aborts_the_request():
    io = ScriptedIO(lambda call, attempt: Published.CANCEL_ASKED if call[1] == "publish" else 1)
    st = _state(io)
    _publish(st, _report(_delta([1], 1)))
    assert st.engine.aborted == [("default/r", "cancelled")] and "default/r" in st.inflight


def test_a_duplicate_is_an_answer_not_a_retry():
    io = ScriptedIO(lambda call, attempt: Published.DUPLICATE if call[1] == "publish" else _ok(call, attempt))
    st = _state(io)
    _publish(st, _report(_delta([1], 1), _delta([2], 2, finished=True)))
    assert len([c for c, _ in io.log if c[1] == "publish"]) == 2 and st.num_finished == 1


def test_a_request_whose_keys_refuse_its_writes_is_dead_lettered_and_acked():
    def answer(call, attempt):
        if call[1] == "publish":
            return ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
        return _ok(call, attempt)

    io = ScriptedIO(answer)
    st = _state(io)
    _publish(st, _report(_delta([1], 1)))
    assert not st.inflight
    dead = [c for c, _ in io.log if c[0] == "XADD"]
    assert len(dead) == 1 and "internal" in dead[0]
    assert io.applied("ack")


def test_out_of_memory_is_reported_until_a_write_goes_through(monkeypatch):
    monkeypatch.setattr("gpu_worker.edge.redis_io.Backoff.sleep", _no_sleep)
    seen = []

    def answer(call, attempt):
        if call[1] == "publish" and attempt == 0:
            return OutOfMemoryError("command not allowed")
        seen.append(st.redis.problem)
        return _ok(call, attempt)

    io = ScriptedIO(answer)
    st = _state(io)
    _publish(st, _report(_delta([1], 1)))
    assert seen[0] is Kind.OOM and st.redis.problem is None


async def _no_sleep(self):
    await asyncio.sleep(0)


def test_a_stored_dead_letter_is_not_added_again_when_its_ack_is_retried(monkeypatch):
    monkeypatch.setattr("gpu_worker.edge.redis_io.Backoff.sleep", _no_sleep)

    def answer(call, attempt):
        if call[1] == "publish":
            return ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
        if call[1] == "ack" and attempt == 0:
            return OutOfMemoryError("command not allowed")  # cannot be: ack first, then retry it
        return _ok(call, attempt)

    io = ScriptedIO(answer)
    st = _state(io)
    _publish(st, _report(_delta([1], 1)))
    kinds = [c[0] if c[0] == "XADD" else c[1] for c, _ in io.log]
    assert kinds == ["publish", "XADD", "ack", "ack"]  # dead letter kept before any ack
