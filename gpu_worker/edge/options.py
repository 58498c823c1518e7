"""A worker's options: keyword-only, immutable, each documented."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from shared import keys


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How one worker talks to Redis.

    redis_url: ``redis://`` or ``rediss://`` (TLS), with ``user:password@`` for ACL users.
    model_name: the namespace of the request streams this worker serves.
    worker_id: the consumer name; unique per process.
    lanes: streams read, strictly in this order of priority.
    local_queue: the most requests held read-but-not-admitted (admission is by free KV
        blocks; everything else stays in the stream for other workers and the autoscaler).
    block_ms: how long one idle XREADGROUP waits for new entries.
    claim_idle_ms: an entry pending this long with no renewal belongs to a dead worker and
        is reclaimed with XAUTOCLAIM. Live workers renew every ``claim_idle_ms / 3``.
    max_deliveries: a request delivered more often than this is poison: dead-lettered, and
        its client gets a ``poison`` failure.
    result_ttl_s: how long progress and results stay readable after the last write.
    drain_grace_s: on SIGTERM, how long in-flight requests may run before being handed
        back (with their progress) for another worker.
    heartbeat_s: how often the worker's status hash is refreshed (TTL 3x this).
    dead_letter_maxlen: approximate cap of the dead-letter stream (served work only).
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    model_name: str = "default"
    worker_id: str = field(default_factory=_default_worker_id)
    lanes: tuple[str, ...] = keys.LANES
    local_queue: int = 4
    block_ms: int = 500
    claim_idle_ms: int = 30_000
    max_deliveries: int = 5
    result_ttl_s: int = 24 * 3600
    drain_grace_s: float = 25.0
    heartbeat_s: float = 2.0
    dead_letter_maxlen: int = 100_000

    def __post_init__(self) -> None:
        keys.check_model(self.model_name)
        if not set(self.lanes) <= set(keys.LANES) or not self.lanes:
            raise ValueError(f"lanes must be a non-empty subset of {keys.LANES}")
        if self.local_queue < 1 or self.claim_idle_ms < 30 or self.max_deliveries < 1:
            raise ValueError("local_queue, max_deliveries must be >= 1 and claim_idle_ms >= 30")

    @property
    def renew_interval_s(self) -> float:
        return self.claim_idle_ms / 3000.0

    @property
    def result_ttl_ms(self) -> int:
        return self.result_ttl_s * 1000
