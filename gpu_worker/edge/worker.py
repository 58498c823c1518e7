"""The worker: asyncio (uvloop) owns all Redis IO; the engine steps in its own thread.

``Worker(engine, options).run()`` serves until SIGTERM/SIGINT, then drains: it stops
reading, lets in-flight requests finish within ``drain_grace_s``, and hands the rest back
(their progress already stored) for another worker to resume.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import time

from gpu_worker.edge import calls, maintenance
from gpu_worker.edge.accept import accept
from gpu_worker.edge.engine_loop import EngineThread
from gpu_worker.edge.intake import Intake
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.publisher import Publisher
from gpu_worker.edge.redis_io import TRANSIENT, Backoff, RedisIO, is_loading, is_nogroup
from gpu_worker.edge.state import WorkerState
from gpu_worker.metrics import WorkerMetrics  # ops: metrics
from shared import keys

logger = logging.getLogger(__name__)


class EngineFailed(RuntimeError):
    """The engine thread died; in-flight entries are left pending for other workers."""


class Worker:
    def __init__(self, engine, options: WorkerOptions,
                 metrics: WorkerMetrics | None = None) -> None:
        self.options = options
        io = RedisIO(options.redis_url)
        engine_thread = EngineThread(engine, on_output=self._from_engine_thread)
        self.state = WorkerState(options=options, io=io, engine=engine_thread,
                                 metrics=metrics or WorkerMetrics(options.model_name))  # ops
        self.publisher = Publisher(self.state)
        self.intake = Intake(io, options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = asyncio.Event()

    def _from_engine_thread(self, report) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.publisher.on_report, report)

    def request_drain(self) -> None:
        """Begin a graceful stop (what SIGTERM does)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drain_requested.set)

    async def run(self, *, install_signal_handlers: bool = True) -> int:
        """Serve until drained; 0 after a clean drain, 1 if the engine failed."""
        self._loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._drain_requested.set)
        await self._connect()
        self.state.engine.start()
        self.state.metrics.health.serving(self.state)  # ops: readiness
        logger.info("worker %s serving %s", self.options.worker_id, ", ".join(self.intake.streams))
        tasks = [asyncio.create_task(coro) for coro in (
            self.publisher.run(), maintenance.lease_loop(self.state),
            maintenance.heartbeat_loop(self.state), maintenance.control_loop(self.state),
            self.state.metrics.health.loop_heartbeat())]  # ops: liveness
        intake = asyncio.create_task(self._intake_loop())
        drain = asyncio.create_task(self._drain_requested.wait())
        done, _ = await asyncio.wait([intake, drain], return_when=asyncio.FIRST_COMPLETED)
        error = intake.exception() if intake in done else None
        failed = error is not None
        if failed:
            logger.error("worker failing: %r", error, exc_info=error)
        if not isinstance(error, EngineFailed):
            await self._drain(intake)
        for task in tasks + [intake, drain]:
            task.cancel()
        await asyncio.gather(*tasks, intake, drain, return_exceptions=True)
        await self._close()
        return 1 if failed else 0

    async def _connect(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.state.io.detect()
                await self.state.io.ensure_groups(list(self.intake.streams))
                return
            except TRANSIENT as exc:
                logger.warning("cannot reach Redis (%s); retrying", exc)
                await backoff.sleep()

    async def _intake_loop(self) -> None:
        st, backoff = self.state, Backoff()
        next_reclaim = 0.0
        while not st.draining:
            if st.engine.error is not None:
                raise EngineFailed(str(st.engine.error))
            room = st.room()
            if room == 0:
                st.capacity.clear()
                try:
                    await asyncio.wait_for(st.capacity.wait(), timeout=0.5)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                entries = []
                if time.monotonic() >= next_reclaim:
                    next_reclaim = time.monotonic() + self.options.claim_idle_ms / 2000.0
                    entries = await self.intake.reclaim(room)
                    st.metrics.on_reclaim(len(entries))  # ops: metrics
                if len(entries) < room:
                    entries += await self.intake.read(room - len(entries), block=not entries)
                await self._take(entries[:room], extra=entries[room:])
                backoff.reset()
            except TRANSIENT as exc:
                logger.warning("Redis unavailable (%s); retrying", exc)
                await backoff.sleep()
            except Exception as exc:
                if is_nogroup(exc):
                    logger.warning("consumer group missing (Redis restarted?); recreating")
                    await self._recreate_groups(backoff)
                elif is_loading(exc):
                    await backoff.sleep()
                else:
                    raise

    async def _recreate_groups(self, backoff: Backoff) -> None:
        try:
            await self.state.io.ensure_groups(list(self.intake.streams))
        except TRANSIENT:
            await backoff.sleep()

    async def _take(self, entries, *, extra) -> None:
        st = self.state
        if extra:  # a blocking read across lanes may return one entry per lane
            await st.io.run(calls.handoff(self.options, extra))
        if not entries:
            return
        accepted = await accept(st.io, self.options, entries, st.metrics)
        if st.draining:
            await st.io.run(calls.handoff(self.options, [inf.entry for inf in accepted]))
            return
        for inf in accepted:
            st.adopt(inf)

    async def _drain(self, intake: asyncio.Task) -> None:
        st = self.state
        st.draining = True
        logger.info("draining: %d requests held, grace %.1fs", len(st.inflight),
                    self.options.drain_grace_s)
        await asyncio.wait([intake], timeout=self.options.block_ms / 1000 + 1)
        st.engine.release_queued()
        deadline = time.monotonic() + self.options.drain_grace_s
        while st.inflight and time.monotonic() < deadline and st.engine.alive:
            await asyncio.sleep(0.02)
        if st.inflight:
            logger.info("grace over: handing back %d running requests", len(st.inflight))
            for inf in list(st.inflight.values()):
                inf.handoff = True
                st.engine.abort(inf.key, "handoff")
            give_up = time.monotonic() + 10.0
            while st.inflight and time.monotonic() < give_up and st.engine.alive:
                await asyncio.sleep(0.02)
        await self.publisher.flush()

    async def _close(self) -> None:
        st = self.state
        st.engine.stop()
        try:
            await maintenance.remove_heartbeat(st)
            await self._delete_consumer_if_idle()
        except TRANSIENT as exc:
            logger.warning("could not clean up on exit: %s", exc)
        await st.io.close()
        logger.info("worker %s stopped after %d results", self.options.worker_id, st.num_finished)

    async def _delete_consumer_if_idle(self) -> None:
        """Delete this consumer only when nothing is pending on it (never lose entries)."""
        client = self.state.io.client
        for stream in self.intake.streams:
            pending = await client.xpending_range(stream, keys.GROUP, "-", "+", 1,
                                                  consumername=self.options.worker_id)
            if not pending:
                await client.xgroup_delconsumer(stream, keys.GROUP, self.options.worker_id)
