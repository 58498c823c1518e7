"""What the worker knows of its Redis: the problem it has now, if any, for readiness,
metrics and a log that says each thing once rather than on every retry."""
from __future__ import annotations

import logging
import time

from gpu_worker.edge.redis_errors import Kind, classify
from gpu_worker.metrics import DISABLED, WorkerMetrics  # ops: metrics

logger = logging.getLogger(__name__)

RELOG_S = 60.0  # a problem that persists (or flaps) is logged again at most this often

_ADVICE = {
    Kind.MISSING: " -- the stream or its consumer group is gone (Redis restarted, or the stream "
                  "was deleted); recreating the group from id 0",
    Kind.DENIED: " -- the worker's ACL user lacks a command or key it needs (see "
                 "ops/redis/users.acl); retrying slowly, not ready meanwhile",
    Kind.OOM: " -- the server is out of memory (maxmemory); reading no new work, still "
              "finishing what is held",
    Kind.REDIRECT: " -- a redirect the cluster client did not follow (slots moving, or a "
                   "cluster behind a proxy that hides its nodes); retrying slowly, not ready",
}
# What a working read or write proves is over (a read works while writes are refused).
_CLEARED_BY_READ = (Kind.TRANSIENT, Kind.MISSING, Kind.DENIED, Kind.REDIRECT)
_CLEARED_BY_WRITE = (Kind.TRANSIENT, Kind.OOM)


class RedisHealth:
    def __init__(self, metrics: WorkerMetrics = DISABLED) -> None:
        self.metrics = metrics
        self.problem: Kind | None = None
        self._logged: dict[Kind, float] = {}

    def on_error(self, exc: BaseException, doing: str) -> Kind:
        """Record an error met while ``doing`` something; its class. Logged at error level
        for what an operator must fix (permissions, memory, a cluster)."""
        kind = classify(exc)
        self.metrics.on_redis_error(kind.value)  # ops: metrics
        if kind is Kind.REQUEST:
            logger.error("Redis error while %s: %r", doing, exc)
            return kind
        now = time.monotonic()
        if kind is not self.problem and now - self._logged.get(kind, -RELOG_S) >= RELOG_S:
            self._logged[kind] = now
            level = logging.WARNING if kind in (Kind.TRANSIENT, Kind.MISSING) else logging.ERROR
            logger.log(level, "Redis %s while %s: %s%s", kind.value, doing, exc,
                       _ADVICE.get(kind, ""))
        self.problem = kind
        self.metrics.redis_refusing(kind is Kind.OOM)  # ops: metrics
        return kind

    def on_ok(self, *, wrote: bool) -> None:
        """A read (or, with ``wrote``, a write) went through."""
        cleared = _CLEARED_BY_WRITE if wrote else _CLEARED_BY_READ
        if self.problem in cleared:
            logger.info("Redis works again (was: %s)", self.problem.value)
            self.problem = None
            self.metrics.redis_refusing(False)  # ops: metrics
