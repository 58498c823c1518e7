"""The soak's faults, on a bounded seeded schedule, and the supervisor that tells them
apart from worker exits nobody caused.

Kinds: ``kill_worker`` (``kill -9`` a ready worker, start a fresh one in its slot),
``stop_worker`` (SIGSTOP for 1-5 s, so sometimes shorter than the workers' claim idle time
and sometimes long enough for a takeover, then SIGCONT)
and ``restart_redis`` (``kill -9`` the server, start it again on the same AOF and port).
After each fault a short probe request times the fleet's recovery.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass

from gpu_worker.bench.soak_procs import RedisProcess, WorkerPool, tail
from gpu_worker.bench.soak_traffic import Gate, Traffic

logger = logging.getLogger(__name__)

FAULT_KINDS = ("kill_worker", "stop_worker", "restart_redis")


def fault_schedule(seed: int, duration_s: float, interval_s: float,
                   kinds: tuple[str, ...] = FAULT_KINDS) -> list[tuple[float, str]]:
    """``(seconds after the start, kind)``: one fault every ``interval_s`` (±30 %), none in
    the last interval, so the fleet has time to settle before the books are closed."""
    rng = random.Random(seed)
    schedule: list[tuple[float, str]] = []
    at = interval_s * rng.uniform(0.7, 1.3)
    while kinds and at < duration_s - interval_s:
        schedule.append((round(at, 3), rng.choice(kinds)))
        at += interval_s * rng.uniform(0.7, 1.3)
    return schedule


@dataclass
class FaultRecord:
    kind: str
    at_s: float  # after the soak's start
    target: str
    unix_at: float
    recovery_s: float | None = None  # fault -> the fleet's next completed probe


class FaultInjector:
    def __init__(self, pool: WorkerPool, redis_proc: RedisProcess, gate: Gate, traffic: Traffic,
                 *, seed: int, stop_s: tuple[float, float] = (1.0, 5.0),
                 redis_down_s: tuple[float, float] = (0.2, 1.5)) -> None:
        self.pool, self.redis, self.gate, self.traffic = pool, redis_proc, gate, traffic
        self.rng = random.Random(seed + 1)
        self.stop_s, self.redis_down_s = stop_s, redis_down_s
        self.faults: list[FaultRecord] = []
        self.skipped: Counter[str] = Counter()
        self._resumes: set[asyncio.Task] = set()

    async def run(self, schedule: list[tuple[float, str]], started: float) -> None:
        """Inject ``schedule`` (``started``: the soak's monotonic start); each fault waits
        for the previous one's probe, so faults never pile up faster than recovery."""
        try:
            for at_s, kind in schedule:
                await asyncio.sleep(max(started + at_s - time.monotonic(), 0.0))
                record = await self._inject(kind, time.monotonic() - started)
                if record is None:
                    self.skipped[kind] += 1
                    continue
                self.faults.append(record)
                done_at = await self.traffic.probe()
                if done_at is not None:
                    record.recovery_s = round(done_at - record.unix_at, 3)
                logger.info("%s %s at %.1fs: recovered in %s s", kind, record.target,
                            record.at_s, record.recovery_s)
        finally:
            await asyncio.gather(*self._resumes, return_exceptions=True)

    async def _inject(self, kind: str, at_s: float) -> FaultRecord | None:
        if kind == "restart_redis":
            return await self._restart_redis(at_s)
        candidates = self.pool.healthy()
        if len(candidates) < 2:  # always leave one worker serving
            return None
        victim = self.rng.choice(candidates)
        record = FaultRecord(kind, round(at_s, 3), victim.worker_id, time.time())
        if kind == "kill_worker":
            self.pool.kill9(victim)
        else:
            self.pool.pause(victim)
            task = asyncio.create_task(self._resume_later(victim, self.rng.uniform(*self.stop_s)))
            self._resumes.add(task)
            task.add_done_callback(self._resumes.discard)
        return record

    async def _resume_later(self, victim, after_s: float) -> None:
        try:
            await asyncio.sleep(after_s)
        finally:
            self.pool.resume(victim)

    async def _restart_redis(self, at_s: float) -> FaultRecord:
        await self.gate.close()
        try:
            record = FaultRecord("restart_redis", round(at_s, 3), "redis", time.time())
            await asyncio.to_thread(self.redis.kill)
            await asyncio.sleep(self.rng.uniform(*self.redis_down_s))
            await asyncio.to_thread(self.redis.start)
        finally:
            self.gate.open()
        return record


async def supervise(pool: WorkerPool, started: float, exits: list[dict]) -> None:
    """Forever: record every worker that exited without the soak ending it (its last log
    lines included), and start a fresh worker in its slot."""
    while True:
        for worker in pool.reap():
            exits.append({"worker_id": worker.worker_id, "returncode": worker.proc.returncode,
                          "at_s": round(time.monotonic() - started, 3),
                          "uptime_s": round(time.monotonic() - worker.started_at, 3),
                          "last_lines": tail(worker.log)})
        await asyncio.sleep(0.25)
