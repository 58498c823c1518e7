"""What the worker's tasks share (all on the event-loop thread)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from gpu_worker.edge.engine_loop import EngineThread, StepReport
from gpu_worker.edge.inflight import Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_health import RedisHealth
from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.metrics import WorkerMetrics  # ops: metrics

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class WorkerState:
    options: WorkerOptions
    io: RedisIO
    engine: EngineThread
    inflight: dict[str, Inflight] = field(default_factory=dict)  # engine key -> request
    unadmitted: set[str] = field(default_factory=set)  # handed to the engine thread, not admitted
    cancelling: set[str] = field(default_factory=set)
    last_report: StepReport = field(default_factory=StepReport)
    capacity: asyncio.Event = field(default_factory=asyncio.Event)
    draining: bool = False
    # Set before the worker's tasks are cancelled: every loop also ends on it, so a client
    # library that swallows a cancellation (redis-py 8.0-8.2 do, README) cannot keep one alive.
    stopping: bool = False
    num_finished: int = 0
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)  # ops: metrics
    redis: RedisHealth = field(init=False)

    def __post_init__(self) -> None:
        self.redis = RedisHealth(self.metrics)

    def room(self) -> int:
        """How many more entries may be read now: the local queue's free places.

        The engine admits by free KV blocks; what it cannot admit waits in the local queue,
        so a worker never holds more than what fits plus ``local_queue``.
        """
        if self.draining:
            return 0
        return max(self.options.local_queue - len(self.unadmitted), 0)

    def adopt(self, inf: Inflight) -> None:
        self.inflight[inf.key] = inf
        self.unadmitted.add(inf.key)
        self.engine.submit(inf.job())

    def forget(self, key: str) -> Inflight | None:
        self.unadmitted.discard(key)
        self.cancelling.discard(key)
        inf = self.inflight.pop(key, None)
        self.capacity.set()
        return inf

    def lose(self, key: str, why: str) -> None:
        """Another worker owns ``key`` now (fenced): stop it here, publish nothing more."""
        if self.forget(key) is not None:
            logger.warning("lost request %s (%s); stopping it here", key, why)
            self.engine.abort(key, "fenced")

    def cancel(self, key: str) -> None:
        inf = self.inflight.get(key)
        if inf is not None and key not in self.cancelling and not inf.handoff:
            self.cancelling.add(key)
            self.engine.abort(key, "cancelled")

    def status(self) -> dict[str, str | int | float]:
        stats = self.last_report.stats
        return {
            "running": int(stats.get("num_running", 0)),
            "waiting": int(stats.get("num_waiting", 0)) + self.last_report.num_queued,
            "held": len(self.inflight),
            "kv_usage": round(float(stats.get("kv_usage", 0.0)), 4),
            "free_blocks": int(stats.get("num_free_blocks", 0)),
            "total_blocks": int(stats.get("num_total_blocks", 0)),
            "finished": self.num_finished,
            "draining": int(self.draining),
        }
