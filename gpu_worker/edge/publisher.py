"""Engine steps out to Redis: one pipelined round-trip per step (or fewer, coalesced).

For every request a step touched: its token event (published on its channel and appended
to its durable progress, owner-checked); when finished, its terminal event (stored, then
published). Acks follow only terminal events the server confirmed stored.
"""
from __future__ import annotations

import asyncio
import logging
import time

from gpu_worker.edge import calls
from gpu_worker.edge.engine_loop import StepReport
from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.redis_io import TRANSIENT, Backoff
from gpu_worker.edge.state import WorkerState
from gpu_worker.outputs import RequestDelta

logger = logging.getLogger(__name__)


class Publisher:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.reports: asyncio.Queue[StepReport] = asyncio.Queue()

    def on_report(self, report: StepReport) -> None:
        """Called on the event-loop thread for every engine pass."""
        self.state.metrics.on_report(report, self.state.inflight)  # ops: metrics
        self.reports.put_nowait(report)

    async def run(self) -> None:
        while True:
            batch = [await self.reports.get()]
            while not self.reports.empty():
                batch.append(self.reports.get_nowait())
            await self.publish(batch)

    async def flush(self) -> None:
        """Publish everything reported so far (used while draining)."""
        batch = []
        while not self.reports.empty():
            batch.append(self.reports.get_nowait())
        if batch:
            await self.publish(batch)

    async def publish(self, batch: list[StepReport]) -> None:
        st = self.state
        plan: list[tuple[str, Inflight]] = []  # what each call means
        writes: list[tuple] = []
        handoffs: list[Entry] = []
        for report in batch:
            st.last_report = report
            for key in report.admitted:
                st.unadmitted.discard(key)
            for key in report.released:
                inf = st.forget(key)
                if inf is not None:
                    handoffs.append(inf.entry)
            for key, code, message in report.failures:
                inf = st.inflight.get(key)
                if inf is not None:
                    plan.append(("finish", inf))
                    writes.append(calls.finish(st.options, st.io.publish_command, inf,
                                               inf.failure(code, message)))
                    writes.append(calls.dead_letter(st.options, inf.entry, code, message))
                    plan.append(("dead", inf))
            for delta in report.deltas:
                self._delta_calls(delta, plan, writes, handoffs)
            if report.admitted or report.released or report.failures:
                st.capacity.set()
        if writes:
            results = await self._run_until_done(writes)
            acks = self._apply(plan, results)
            if acks:
                await self._run_until_done(calls.ack(st.options, acks))
        if handoffs:
            await self._run_until_done(calls.handoff(st.options, handoffs))
            logger.info("handed back %d requests", len(handoffs))

    def _delta_calls(self, delta: RequestDelta, plan: list, writes: list, handoffs: list) -> None:
        st = self.state
        inf = st.inflight.get(delta.request_id)
        if inf is None:
            return  # fenced or already finished here
        event = inf.token_event(delta)
        if event is not None:
            first = None
            if event.seq == 0:
                first = inf.first_token_at = time.time()
            plan.append(("publish", inf))
            writes.append(calls.publish(st.options, st.io.publish_command, inf, event, first))
        if not delta.finished:
            return
        if inf.handoff:
            st.forget(inf.key)
            handoffs.append(inf.entry)
            return
        plan.append(("finish", inf))
        writes.append(calls.finish(st.options, st.io.publish_command, inf,
                                   inf.terminal_event(delta, st.options.worker_id)))

    def _apply(self, plan: list[tuple[str, Inflight]], results: list) -> list[Entry]:
        st = self.state
        acks: list[Entry] = []
        for (kind, inf), result in zip(plan, results):
            if isinstance(result, Exception):
                logger.error("%s for %s failed: %s", kind, inf.key, result)
                continue
            if kind == "publish" and result == 0 or kind == "finish" and result == 0:
                st.lose(inf.key, f"{kind} fenced")
            elif kind == "publish" and result == 2:
                st.cancel(inf.key)
            elif kind == "finish":
                st.forget(inf.key)
                st.num_finished += 1
                acks.append(inf.entry)
        return acks

    async def _run_until_done(self, writes: list[tuple]) -> list:
        """Retry the round-trip through connection loss: progress must not be dropped.

        A retried script may append a token event twice; readers skip repeated ``seq``.
        """
        backoff = Backoff()
        while True:
            try:
                return await self.state.io.run(writes)
            except TRANSIENT as exc:
                logger.warning("publishing failed (%s); retrying", exc)
                await backoff.sleep()
