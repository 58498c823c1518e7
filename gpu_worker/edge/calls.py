"""Builders of the Redis calls a worker pipelines (pure: no IO here)."""
from __future__ import annotations

from collections import defaultdict

from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.scripts import RequestKeys
from shared import codec, errors, keys
from shared.digest import request_digest
from shared.failures import dead_letter_reason
from shared.protocol import Choice, Failure, Request, Result, Token

_DEAD_PAYLOAD_BYTES = 4096  # a dead letter keeps the head of the payload, for forensics


def begin(options: WorkerOptions, tenant: str, request_id: str, entry: Entry, now: float,
          request: Request | None = None) -> tuple:
    """BEGIN; ``request`` (None: malformed) gives the digest checked against the id's."""
    entry_ref = f"{entry.stream}|{entry.entry_id}"
    digest = conflict = ""
    if request is not None:
        digest = request_digest(request)
        conflict = codec.encode(Failure(
            request_id=request_id, code=errors.ID_CONFLICT,
            message="this request id is taken by a different request (another prompt or "
                    "sampling parameters); use a fresh id for a different request"))
    return ("script", "begin", list(RequestKeys.of(tenant, request_id)),
            [options.worker_id, entry_ref, options.result_ttl_ms, repr(now), digest, conflict,
             request.n if request is not None else 1])


def publish(options: WorkerOptions, publish_command: str, inf: Inflight, event: Token,
            first_token_at: float | None) -> tuple:
    stamp = "" if first_token_at is None else repr(first_token_at)
    counter = [f"published:{event.index}"] if event.index else []
    return ("script", "publish", list(inf.redis_keys),
            [inf.owner, options.result_ttl_ms, publish_command, codec.encode(event), stamp,
             event.seq, event.seq + len(event.token_ids), *counter])


def end_choice(inf: Inflight, choice: Choice) -> tuple:
    """Store how one choice of several ended (owner-checked, after its tokens)."""
    return ("script", "end_choice", list(inf.redis_keys),
            [inf.owner, choice.index, codec.encode(choice), len(choice.token_ids)])


def finish(options: WorkerOptions, publish_command: str, inf: Inflight,
           event: Result | Failure) -> tuple:
    num_tokens = len(event.token_ids) if isinstance(event, Result) else ""
    per_choice = [len(c.token_ids) for c in event.choices[1:]] \
        if isinstance(event, Result) and event.choices else []
    return ("script", "finish", list(inf.redis_keys),
            [inf.owner, options.result_ttl_ms, publish_command, codec.encode(event), num_tokens,
             *per_choice])


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
            "code", code, "reason", dead_letter_reason(code), "message", message[:1000],
            "deliveries", entry.deliveries,
            "worker_id", options.worker_id, "data", raw[:_DEAD_PAYLOAD_BYTES])
