"""What the worker's tasks share (all on the event-loop thread)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from gpu_worker.edge.engine_loop import EngineThread, StepReport
from gpu_worker.edge.inflight import Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_errors import Kind, classify
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
    num_finished: int = 0
    redis_problem: Kind | None = None  # the server's last refusal, until it works again
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)  # ops: metrics

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

    def on_redis_error(self, exc: BaseException, doing: str) -> Kind:
        """Record a Redis error met while ``doing`` something; logged once per change of
        kind (a retry loop does not flood the log), at error level for what an operator
        must fix (permissions, memory, a cluster)."""
        kind = classify(exc)
        self.metrics.on_redis_error(kind.value)  # ops: metrics
        if kind is Kind.REQUEST:
            logger.error("Redis error while %s: %r", doing, exc)
            return kind
        if kind is not self.redis_problem:
            level = logging.WARNING if kind in (Kind.TRANSIENT, Kind.MISSING) else logging.ERROR
            logger.log(level, "Redis %s while %s: %s%s", kind.value, doing, exc, _ADVICE.get(kind, ""))
        self.redis_problem = kind
        self.metrics.redis_refusing(kind is Kind.OOM)  # ops: metrics
        return kind

    def on_redis_ok(self) -> None:
        """A read or a write worked: clear any problem but out-of-memory (reads work then)."""
        if self.redis_problem is not None and self.redis_problem is not Kind.OOM:
            logger.info("Redis works again (was: %s)", self.redis_problem.value)
            self.redis_problem = None

    def on_redis_write_ok(self) -> None:
        if self.redis_problem is not None:
            logger.info("Redis takes writes again (was: %s)", self.redis_problem.value)
            self.redis_problem = None
            self.metrics.redis_refusing(False)  # ops: metrics

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


_ADVICE = {
    Kind.MISSING: " -- the stream or its consumer group is gone (Redis restarted, or the stream "
                  "was deleted); recreating the group from id 0",
    Kind.DENIED: " -- the worker's ACL user lacks a command or key it needs (see "
                 "ops/redis/users.acl); retrying slowly, not ready meanwhile",
    Kind.OOM: " -- the server is out of memory (maxmemory); reading no new work, still "
              "finishing what is held",
    Kind.REDIRECT: " -- the server is a Redis Cluster node, which this worker does not "
                   "support yet; point it at a single server. Retrying slowly, not ready",
}
