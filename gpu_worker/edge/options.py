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
    tenants_refresh_s: how often the tenant registry is re-read (tenants added or removed
        are served, or no longer read, within this time; no restart).
    legacy_streams: also drain the streams every tenant shared before per-tenant streams
        (``fleet:<model>:requests:<lane>``), so an upgrade loses nothing; the payload names
        the tenant there (only operators can still write them).
    stream_interval_ms: coalesce a request's token events so each is published at most
        once per this interval (0: every engine step, the lowest latency). The first token
        and the terminal event are never delayed.
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
    tenants_refresh_s: float = 5.0
    legacy_streams: bool = True
    stream_interval_ms: int = 0

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
