"""Builders of the Redis calls a worker pipelines (pure: no IO here)."""
from __future__ import annotations

from collections import defaultdict

from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.scripts import RequestKeys
from shared import codec, keys
from shared.protocol import Failure, Result, Token

_DEAD_PAYLOAD_BYTES = 4096  # a dead letter keeps the head of the payload, for forensics


def begin(options: WorkerOptions, tenant: str, request_id: str, entry: Entry, now: float) -> tuple:
    entry_ref = f"{entry.stream}|{entry.entry_id}"
    return ("script", "begin", list(RequestKeys.of(tenant, request_id)),
            [options.worker_id, entry_ref, options.result_ttl_ms, repr(now)])


def publish(options: WorkerOptions, publish_command: str, inf: Inflight, event: Token,
            first_token_at: float | None) -> tuple:
    stamp = "" if first_token_at is None else repr(first_token_at)
    return ("script", "publish", list(inf.redis_keys),
            [inf.owner, options.result_ttl_ms, publish_command, codec.encode(event), stamp,
             event.seq, event.seq + len(event.token_ids)])


def finish(options: WorkerOptions, publish_command: str, inf: Inflight,
           event: Result | Failure) -> tuple:
    num_tokens = len(event.token_ids) if isinstance(event, Result) else ""
    return ("script", "finish", list(inf.redis_keys),
            [inf.owner, options.result_ttl_ms, publish_command, codec.encode(event), num_tokens])


def _by_stream(entries: list[Entry]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        groups[e.stream].append(e.entry_id)
    return groups


def ack(options: WorkerOptions, entries: list[Entry]) -> list[tuple]:
    """Owner-checked XACK + XDEL, one script call per stream."""
    return [("script", "ack", [stream], [keys.GROUP, options.worker_id, *ids])
            for stream, ids in _by_stream(entries).items()]


def renew(options: WorkerOptions, stream: str, entry_ids: list[str]) -> tuple:
    """Owner-checked lease renewal of entries of one stream; replies the ids lost."""
    return ("script", "renew", [stream], [keys.GROUP, options.worker_id, *entry_ids])


def handoff(options: WorkerOptions, entries: list[Entry]) -> list[tuple]:
    idle = options.claim_idle_ms + 1
    return [("script", "handoff", [stream],
             [keys.GROUP, options.worker_id, keys.HANDOFF_CONSUMER, idle, *ids])
            for stream, ids in _by_stream(entries).items()]


def dead_letter(options: WorkerOptions, entry: Entry, code: str, message: str) -> tuple:
    raw = entry.payload or b""
    if isinstance(raw, str):
        raw = raw.encode()
    return ("XADD", keys.dead_letter_key(options.model_name), "MAXLEN", "~",
            options.dead_letter_maxlen, "*", "stream", entry.stream, "entry_id", entry.entry_id,
            "code", code, "message", message[:1000], "deliveries", entry.deliveries,
            "worker_id", options.worker_id, "data", raw[:_DEAD_PAYLOAD_BYTES])
