"""Engine steps out to Redis: one pipelined round-trip per step (or fewer, coalesced).

For every request a step touched: its token event (published on its channel and appended
to its durable progress, owner-checked and in ``seq`` order); when finished, its terminal
event (stored, then published). Acks follow only terminal events the server confirmed
stored. A write the server refuses as a whole (connection lost, out of memory, a
failover) is retried, alone and in order, until it is answered: progress is never dropped,
and a retried write the server had already applied is recognised, not repeated.

Coalescing (``stream_interval_ms`` > 0): a request's new tokens are held and go out as one
event ``[seq, end)`` with the first engine report at least an interval after its last
event (or an interval later still, if the engine stalls); its first event, and whatever is
held when it ends, fails or is handed back, go out at once. At 0 every engine step of a
request is one event.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gpu_worker.edge import calls
from gpu_worker.edge.engine_loop import StepReport
from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.redis_errors import Kind, classify
from gpu_worker.edge.redis_io import Backoff
from gpu_worker.edge.scripts import Finished, Published
from gpu_worker.edge.state import WorkerState
from gpu_worker.outputs import RequestDelta
from shared import errors
from shared.failures import is_rejection  # ops: a rejection is not a dead letter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Write:
    """One call of a batch, and what its answer means: ``kind`` is publish, choice (one
    choice of several ended), finish or dead."""

    kind: str
    inf: Inflight
    call: tuple


_REPLY = {"publish": Published, "choice": Finished, "finish": Finished}  # the reply of each script


class Publisher:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.reports: asyncio.Queue[StepReport] = asyncio.Queue()
        self.interval_s = state.options.stream_interval_ms / 1000.0
        self._held: dict[str, Inflight] = {}  # requests with tokens not yet published

    def on_report(self, report: StepReport) -> None:
        """Called on the event-loop thread for every engine pass."""
        self.state.metrics.on_report(report, self.state.inflight)  # ops: metrics
        self.reports.put_nowait(report)

    async def run(self) -> None:
        while not self.state.stopping:
            await self.publish(await self._next_batch())

    async def _next_batch(self) -> list[StepReport]:
        """Every report waiting (at least one); or none, when held tokens have been due for
        an interval and no report came (the engine stalled). Due tokens go out with the next
        report: flushing them on a timer of their own would add round trips between steps."""
        if self._held:
            last = min(inf.last_published or 0.0 for inf in self._held.values())
            wait = last + 2 * self.interval_s - time.monotonic()
            try:
                first = await asyncio.wait_for(self.reports.get(), max(wait, 0.0))
            except asyncio.TimeoutError:
                return []
        else:
            first = await self.reports.get()
        return [first, *self._take_reports()]

    def _take_reports(self) -> list[StepReport]:
        return [self.reports.get_nowait() for _ in range(self.reports.qsize())]

    async def flush(self) -> None:
        """Publish everything reported so far, held tokens included (used while draining)."""
        await self.publish(self._take_reports(), flush_all=True)

    async def publish(self, batch: list[StepReport], *, flush_all: bool = False) -> None:
        st = self.state
        writes: list[_Write] = []
        handoffs: list[Entry] = []
        for report in batch:
            st.last_report = report
            st.unadmitted.difference_update(report.admitted)
            for key in report.released:
                inf = st.forget(key)
                if inf is not None:
                    writes.extend(self._take_held(inf))
                    handoffs.append(inf.entry)
            for key, code, message in report.failures:
                inf = st.inflight.get(key)
                if inf is not None:
                    writes.extend(self._take_held(inf))
                    writes.append(_Write("finish", inf, calls.finish(
                        st.options, st.io.publish_command, inf, inf.failure(code, message))))
                    if not is_rejection(code):
                        writes.append(_Write("dead", inf, calls.dead_letter(
                            st.options, inf.entry, code, message)))
            for delta in report.deltas:
                writes.extend(self._delta_writes(delta, handoffs))
            if report.admitted or report.released or report.failures:
                st.capacity.set()
        writes.extend(self._due_writes(flush_all))
        acks, dead = self._apply(writes, await self._run_until_answered(writes), handoffs)
        # Dead letters get a round trip of their own: an entry is acked only once it is kept.
        await self._run_until_answered_raw(dead)
        await self._run_until_answered_raw(calls.ack(st.options, acks))
        if handoffs:
            await self._run_until_answered_raw(calls.handoff(st.options, handoffs))
            logger.info("handed back %d requests", len(handoffs))

    def _delta_writes(self, delta: RequestDelta, handoffs: list[Entry]) -> list[_Write]:
        st = self.state
        inf = st.inflight.get(delta.request_id)
        if inf is None:
            return []  # fenced or already finished here
        ended = inf.record(delta)
        out: list[_Write] = []
        if self.interval_s == 0:
            out = self._take_held(inf)  # one event per engine step
        elif inf.holds_tokens:
            self._held[inf.key] = inf
        if not delta.finished:
            return out
        out += self._take_held(inf)
        if ended is not None and not inf.all_ended:  # one choice of several: stored, not final
            out.append(_Write("choice", inf, calls.end_choice(inf, ended)))  # (a hand-back too)
            return out
        if inf.handoff:
            st.forget(inf.key)
            handoffs.append(inf.entry)
            return out
        out.append(_Write("finish", inf, calls.finish(
            st.options, st.io.publish_command, inf, inf.terminal_event(delta, st.options.worker_id))))
        return out

    def _due_writes(self, flush_all: bool) -> list[_Write]:
        """The token events of held requests whose interval has passed (all: ``flush_all``)."""
        now = time.monotonic()
        out: list[_Write] = []
        for key, inf in list(self._held.items()):
            if self.state.inflight.get(key) is not inf:
                del self._held[key]  # fenced, or forgotten: nothing more goes out
            elif flush_all or inf.due(now, self.interval_s):
                out.extend(self._take_held(inf))
        return out

    def _take_held(self, inf: Inflight) -> list[_Write]:
        """The write of one event carrying every token ``inf`` holds (none if it holds none)."""
        self._held.pop(inf.key, None)
        st = self.state
        out = []
        for event in inf.take_events():
            first = None
            if event.seq == 0 and (event.index == 0 or inf.first_token_at is None):
                first = inf.first_token_at = time.time()
            inf.last_published = time.monotonic()
            out.append(_Write("publish", inf, calls.publish(
                st.options, st.io.publish_command, inf, event, first)))
        return out

    def _apply(self, writes: list[_Write], answers: list,
               handoffs: list[Entry]) -> tuple[list[Entry], list[tuple]]:
        """Act on each answer; the entries to acknowledge and the dead letters to add."""
        st = self.state
        acks: list[Entry] = []
        dead: list[tuple] = []
        for w, answer in zip(writes, answers):
            if w.kind == "dead":
                if isinstance(answer, Exception):
                    logger.error("dead-lettering %s failed: %s", w.inf.key, answer)
                continue
            if w.inf.key not in st.inflight:
                continue  # given up earlier in this batch
            if isinstance(answer, Exception):  # about this request's own keys
                why = f"{w.kind} failed: {answer}"
                logger.error("request %s: %s; dead-lettering it", w.inf.key, why)
                st.lose(w.inf.key, why)
                st.metrics.on_dead_letter()  # ops: metrics
                dead.append(calls.dead_letter(st.options, w.inf.entry, errors.INTERNAL, why))
                acks.append(w.inf.entry)
            elif w.kind == "publish" and answer == Published.CANCEL_ASKED:
                st.cancel(w.inf.key)
            elif w.kind == "choice" and answer != Finished.FENCED:
                continue  # stored (or a gap: then the request's FINISH is refused just the same)
            elif answer == _REPLY[w.kind].FENCED:
                st.lose(w.inf.key, f"{w.kind} fenced")
            elif _is_gap(w, answer):  # an earlier event is not stored: another attempt resumes from what is
                st.lose(w.inf.key, "progress out of order")
                handoffs.append(w.inf.entry)
            elif w.kind == "finish":
                st.forget(w.inf.key)
                st.num_finished += 1
                acks.append(w.inf.entry)
        return acks, dead

    async def _run_until_answered(self, writes: list[_Write]) -> list:
        """Each write's answer. A write refused by the server as a whole (or that found an
        earlier write of its request still unstored) is retried with backoff, in order;
        anything else is an answer."""
        answers: list = [None] * len(writes)
        pending = list(range(len(writes)))
        backoff = Backoff()
        while pending:
            got = await self._round_trip([writes[i].call for i in pending], backoff)
            retry: list[int] = []
            waiting: set[str] = set()  # requests with an earlier write still to retry
            for i, answer in zip(pending, got):
                w = writes[i]
                if _refused(answer) or (_is_gap(w, answer) and w.inf.key in waiting):
                    retry.append(i)
                    waiting.add(w.inf.key)
                else:
                    answers[i] = answer
            pending = retry
            if pending:
                await backoff.sleep()
        return answers

    async def _run_until_answered_raw(self, batch: list[tuple]) -> None:
        """The same for plain calls (acks, handoffs, dead letters): the refused ones are
        retried, so a dead letter that was stored is never added twice."""
        backoff = Backoff()
        while batch:
            got = await self._round_trip(batch, backoff)
            batch = [call for call, answer in zip(batch, got) if _refused(answer)]
            if batch:
                await backoff.sleep()

    async def _round_trip(self, batch: list[tuple], backoff: Backoff) -> list:
        while True:
            try:
                answers = await self.state.io.run(batch)
            except Exception as exc:  # noqa: BLE001 - the connection; never drop progress
                self.state.redis.on_error(exc, "publishing")
                await backoff.sleep()
                continue
            refused = next((a for a in answers if _refused(a)), None)
            if refused is not None:
                self.state.redis.on_error(refused, "publishing")
            else:
                self.state.redis.on_ok(wrote=True)
            return answers


def _refused(answer) -> bool:
    return isinstance(answer, Exception) and classify(answer) is not Kind.REQUEST


def _is_gap(w: _Write, answer) -> bool:
    return w.kind in _REPLY and answer == _REPLY[w.kind].GAP
