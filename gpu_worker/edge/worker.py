"""The worker: asyncio (uvloop) owns all Redis IO; the engine steps in its own thread.

``Worker(engine, options).run()`` serves until SIGTERM/SIGINT, then drains: it stops
reading, lets in-flight requests finish within ``drain_grace_s``, and hands the rest back
(their progress already stored) for another worker to resume.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from gpu_worker.edge import calls, maintenance
from gpu_worker.edge.accept import accept
from gpu_worker.edge.engine_loop import EngineThread
from gpu_worker.edge.fairshare import FairShare, Held, estimate_tokens
from gpu_worker.edge.intake import Intake
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.publisher import Publisher
from gpu_worker.edge.redis_errors import Kind
from gpu_worker.edge.redis_io import Backoff, RedisIO
from gpu_worker.edge.sources import SCRIPTS, Sources
from gpu_worker.edge.state import WorkerState
from gpu_worker.metrics import WorkerMetrics  # ops: metrics
from shared import keys
from shared.tasks import cancel_and_wait

logger = logging.getLogger(__name__)


SLOW_RETRY_S = 5.0  # how often a worker retries what an operator must fix (ACL, memory)


async def _stop(tasks: list[asyncio.Task], state: WorkerState) -> None:
    """Cancel the worker's tasks and wait for them, boundedly (:mod:`shared.tasks`); every
    loop also ends on ``state.stopping``, so one whose cancellation was swallowed ends too."""
    state.stopping = True
    await cancel_and_wait(tasks, logger)


class EngineFailed(RuntimeError):
    """The engine thread died: every held request is handed back, with its progress."""


class Worker:
    def __init__(self, engine, options: WorkerOptions,
                 metrics: WorkerMetrics | None = None) -> None:
        self.options = options
        io = RedisIO(options.redis_url, extra_scripts=SCRIPTS)
        engine_thread = EngineThread(engine, on_output=self._from_engine_thread)
        self.state = WorkerState(options=options, io=io, engine=engine_thread,
                                 metrics=metrics or WorkerMetrics(options.model_name))  # ops
        self.publisher = Publisher(self.state)
        self.sources = Sources(io, options)
        self.fair = FairShare()
        self.intake = Intake(io, options, self.sources, self.fair)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = asyncio.Event()

    def _from_engine_thread(self, report) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.publisher.on_report, report)

    async def run(self) -> int:
        """Serve until drained; 0 after a clean drain, 1 if the engine failed."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._drain_requested.set)
        await self._connect()
        self.state.engine.start()
        self.state.metrics.health.serving(self.state)  # ops: readiness
        logger.info("worker %s serving %s", self.options.worker_id,
                    ", ".join(self.sources.by_name) or "no tenant yet")
        tasks = [asyncio.create_task(coro, name=coro.__qualname__) for coro in (
            self.publisher.run(), maintenance.lease_loop(self.state),
            maintenance.heartbeat_loop(self.state), maintenance.control_loop(self.state),
            self.state.metrics.health.loop_heartbeat())]  # ops: liveness
        intake = asyncio.create_task(self._intake_loop())
        drain = asyncio.create_task(self._drain_requested.wait())
        done, _ = await asyncio.wait([intake, drain], return_when=asyncio.FIRST_COMPLETED)
        error = intake.exception() if intake in done else None
        if error is not None:
            logger.error("worker failing: %r", error, exc_info=error)
        if isinstance(error, EngineFailed):
            await self._hand_back_all()
        else:
            await self._drain(intake)
        await _stop(tasks + [intake, drain], self.state)
        await self._close()
        return 0 if error is None else 1

    async def _connect(self) -> None:
        """Until Redis answers and the groups exist; never gives up (a crash loop would
        not fix Redis either), retrying what an operator must fix slowly."""
        backoff = Backoff()
        while True:
            try:
                await self.state.io.detect()
                await self.sources.refresh()
                self.state.redis.on_ok(wrote=False)
                return
            except Exception as exc:  # noqa: BLE001 - every Redis error has a behaviour
                await self._after_redis_error(exc, "connecting", backoff)

    async def _intake_loop(self) -> None:
        st, backoff = self.state, Backoff()
        next_reclaim = 0.0
        next_refresh = time.monotonic() + self.options.tenants_refresh_s
        while not st.draining:
            if st.engine.error is not None:
                raise EngineFailed(str(st.engine.error))
            room = st.room()
            if st.redis.problem is Kind.OOM:
                room = min(room, 1)  # a probe: one entry, handed back if writes still fail
            if room == 0:
                st.capacity.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(st.capacity.wait(), timeout=0.5)
                continue
            try:
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.options.tenants_refresh_s
                    _, removed = await self.sources.refresh()
                    for source in removed:
                        self.fair.forget(source.name)
                entries = []
                if time.monotonic() >= next_reclaim:
                    next_reclaim = time.monotonic() + self.options.claim_idle_ms / 2000.0
                    entries = await self.intake.reclaim(room)
                    st.metrics.on_reclaim(len(entries))  # ops: metrics
                if len(entries) < room:
                    entries += await self.intake.read(room - len(entries), block=not entries,
                                                      held=self._held())
                await self._take(entries[:room], extra=entries[room:])
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - no Redis error ends the worker
                await self._after_redis_error(exc, "reading work", backoff)

    async def _after_redis_error(self, exc: BaseException, doing: str, backoff: Backoff) -> None:
        kind = self.state.redis.on_error(exc, doing)
        if kind is Kind.MISSING:
            try:
                await self.state.io.ensure_groups(list(self.sources.streams))
            except Exception as again:  # noqa: BLE001
                self.state.redis.on_error(again, "recreating the consumer groups")
                await backoff.sleep()
        elif kind in (Kind.DENIED, Kind.REDIRECT, Kind.OOM):
            await asyncio.sleep(SLOW_RETRY_S)
        else:
            if kind is Kind.REQUEST:  # unexpected: logged with its traceback, never fatal
                logger.error("unexpected error while %s", doing, exc_info=exc)
            await backoff.sleep()

    async def _take(self, entries, *, extra) -> None:
        st = self.state
        if extra:  # a blocking read across lanes may return one entry per lane
            await st.io.run(calls.handoff(self.options, extra))
        entries = self._not_held(entries)
        if not entries:
            st.redis.on_ok(wrote=False)
            return
        accepted = await accept(st.io, self.options, entries, st.metrics)
        if st.draining:
            accepted.handback += [inf.entry for inf in accepted.running]
            accepted.running = []
        sources, held = self.sources.streams, self._held()
        for inf in accepted.running:
            source = sources.get(inf.entry.stream)
            if source is not None:  # a tenant holding less waits less in the engine's queue
                h = held.setdefault(source.name, Held())
                inf.share_rank = int(h.requests / source.config.weight)
                h.requests += 1
                self.fair.charge(source.name, estimate_tokens(inf.request), source.config.weight)
            st.adopt(inf)
        if accepted.handback:
            await st.io.run(calls.handoff(self.options, accepted.handback))
        if accepted.error is not None:
            raise accepted.error
        st.redis.on_ok(wrote=True)

    def _held(self) -> dict[str, Held]:
        """Per source: the requests (and their estimated tokens) this worker holds."""
        sources = self.sources.streams
        held: dict[str, Held] = {}
        for inf in self.state.inflight.values():
            source = sources.get(inf.entry.stream)
            if source is not None:
                h = held.setdefault(source.name, Held())
                h.requests += 1
                h.tokens += estimate_tokens(inf.request)
        return held

    def _not_held(self, entries: list) -> list:
        """Each entry once, and none this worker already runs: a worker paused in a blocking
        read can be delivered an entry and, once resumed, also reclaim it (idle meanwhile);
        beginning it twice would fence itself out of its own request."""
        seen = {(inf.entry.stream, inf.entry.entry_id) for inf in self.state.inflight.values()}
        fresh = []
        for e in entries:
            if (e.stream, e.entry_id) not in seen:
                seen.add((e.stream, e.entry_id))
                fresh.append(e)
        return fresh

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

    async def _hand_back_all(self) -> None:
        """The engine is broken: publish what it reported, then give every held request
        back (its progress is stored) so other workers resume it now, not after a claim
        timeout."""
        st = self.state
        st.draining = True
        try:
            await asyncio.wait_for(self.publisher.flush(), timeout=self.options.drain_grace_s)
            held = [inf.entry for inf in st.inflight.values()]
            if held:
                await st.io.run(calls.handoff(self.options, held))
                logger.error("engine failed: handed back %d requests", len(held))
            st.inflight.clear()
        except Exception as exc:  # noqa: BLE001 - they will be reclaimed after the idle time
            logger.error("could not hand back the held requests: %r", exc)

    async def _close(self) -> None:
        st = self.state
        st.engine.stop()
        try:
            await maintenance.remove_heartbeat(st)
            await self._delete_consumer_if_idle()
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            logger.warning("could not clean up on exit: %s", exc)
        await st.io.close()
        logger.info("worker %s stopped after %d results", self.options.worker_id, st.num_finished)

    async def _delete_consumer_if_idle(self) -> None:
        """Delete this consumer only when nothing is pending on it (never lose entries)."""
        client = self.state.io.client
        for stream in self.sources.streams:
            pending = await client.xpending_range(stream, keys.GROUP, "-", "+", 1,
                                                  consumername=self.options.worker_id)
            if not pending:
                await client.xgroup_delconsumer(stream, keys.GROUP, self.options.worker_id)
