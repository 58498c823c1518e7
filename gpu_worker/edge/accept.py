"""Turning read entries into owned requests, or ending them at once.

Every entry ends in exactly one of: owned and handed to the engine; a duplicate of a
request already done or owned elsewhere (acked, nothing generated); a terminal event stored
for its client (cancelled before start, deadline passed, poison, malformed but addressable)
then acked; or, unaddressable, dead-lettered and acked. One pipelined round-trip begins all
entries of a read; one more stores the terminal events; acks follow what was stored.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from gpu_worker.edge import calls
from gpu_worker.edge.inflight import Entry, Inflight, resume_state
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.metrics import DISABLED, WorkerMetrics  # ops: metrics
from gpu_worker.outputs import RequestDelta
from shared import codec, errors, keys
from shared.errors import ProtocolError
from shared.protocol import Request

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    entry: Entry
    request: Request | None
    tenant: str | None = None
    request_id: str | None = None
    code: str | None = None  # set: the entry fails (and is dead-lettered)
    message: str = ""


def _plan(entry: Entry, options: WorkerOptions) -> _Plan:
    raw = entry.fields.get(keys.STREAM_FIELD.encode(), entry.fields.get(keys.STREAM_FIELD))
    try:
        request = codec.decode_request(raw if raw is not None else b"")
    except ProtocolError as exc:
        return _Plan(entry, None, exc.tenant, exc.request_id, exc.code, exc.message)
    plan = _Plan(entry, request, request.tenant, request.request_id)
    if entry.deliveries > options.max_deliveries:
        plan.code = errors.POISON
        plan.message = (f"delivered {entry.deliveries} times without finishing "
                        f"(limit {options.max_deliveries})")
    return plan


async def accept(io: RedisIO, options: WorkerOptions, entries: list[Entry],
                 metrics: WorkerMetrics = DISABLED) -> list[Inflight]:
    """Begin ``entries`` in Redis; return the ones the engine should now run."""
    plans = [_plan(e, options) for e in entries]
    addressed = [p for p in plans if p.request_id is not None]
    now = time.time()
    replies = await io.run([calls.begin(options, p.tenant, p.request_id, p.entry, now)
                            for p in addressed])
    accepted: list[Inflight] = []
    writes: list[tuple] = []
    finished: list[Entry] = []  # ack once the write pipeline has stored their events
    for plan, reply in zip(addressed, replies):
        if isinstance(reply, Exception):
            raise reply
        status = reply[0].decode()
        if status != "ok":
            logger.info("entry %s: request %s is %s; acknowledging without generating",
                        plan.entry.entry_id, plan.request_id, status)
            finished.append(plan.entry)
            if plan.code is not None:
                writes.append(calls.dead_letter(options, plan.entry, plan.code, plan.message))
                metrics.on_dead_letter()  # ops: metrics
            continue
        inf = _inflight(plan, reply, options)
        outcome = _terminal_now(plan, inf, reply[2] == b"1", now, options)
        if outcome is None:
            accepted.append(inf)
            continue
        writes.append(calls.finish(options, io.publish_command, inf, outcome))
        metrics.on_terminal(outcome)  # ops: metrics
        if plan.code is not None:
            writes.append(calls.dead_letter(options, plan.entry, plan.code, plan.message))
            metrics.on_dead_letter()  # ops: metrics
        finished.append(plan.entry)
    for plan in plans:
        if plan.request_id is None:
            logger.warning("dead-lettering entry %s of %s: %s: %s", plan.entry.entry_id,
                           plan.entry.stream, plan.code, plan.message)
            writes.append(calls.dead_letter(options, plan.entry, plan.code, plan.message))
            metrics.on_dead_letter()  # ops: metrics
            finished.append(plan.entry)
    if writes:
        for result in await io.run(writes):
            if isinstance(result, Exception):
                raise result
    if finished:
        await io.run(calls.ack(options, finished))
    return accepted


def _inflight(plan: _Plan, reply: list, options: WorkerOptions) -> Inflight:
    token_ids, text = resume_state(reply[5:])
    first_token = reply[4].decode() if reply[4] else ""
    request = plan.request
    if request is None:  # malformed but addressable: a stand-in, only to store the failure
        request = Request(request_id=plan.request_id, tenant=plan.tenant, prompt="")
    return Inflight(request=request, entry=plan.entry, owner=reply[1].decode(),
                    prior_token_ids=token_ids, prior_text=text,
                    first_start=float(reply[3]),
                    first_token_at=float(first_token) if first_token else None)


def _terminal_now(plan: _Plan, inf: Inflight, cancelled: bool, now: float,
                  options: WorkerOptions):
    """The terminal event due before any engine work, or None to run the request."""
    if plan.code is not None:
        logger.warning("failing request %s (%s): %s", plan.request_id, plan.code, plan.message)
        return inf.failure(plan.code, plan.message)
    reason = None
    if cancelled:
        reason = "cancelled"
    elif plan.request.deadline is not None and plan.request.deadline <= now:
        reason = "timeout"
    elif len(inf.prior_token_ids) >= plan.request.max_tokens:
        reason = "length"  # a previous worker generated everything but died before finishing
    if reason is None:
        return None
    delta = RequestDelta(request_id=inf.key, new_token_ids=[], new_text="", finished=True,
                         finish_reason=reason, num_output_tokens=len(inf.prior_token_ids))
    return inf.terminal_event(delta, options.worker_id)
