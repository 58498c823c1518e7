"""Turning read entries into owned requests, or ending them at once.

Every entry ends in exactly one of: owned and handed to the engine; a duplicate of a
request already done or owned elsewhere (acked, nothing generated); a terminal event stored
for its client (cancelled before start, deadline passed, poison, malformed but addressable)
then acked; unaddressable, dead-lettered and acked; or handed back untouched when the
server refused the writes that would end it (out of memory, permissions), without counting
a delivery. One pipelined round-trip begins all entries of a read; one more stores the
terminal events; acks follow what was stored.

Every entry is hostile: whatever goes wrong while one is read, planned or begun ends that
entry alone. The delivery count is checked before the payload is parsed, so even an entry
that kills the process on parsing is dead-lettered after ``max_deliveries``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import msgspec

from gpu_worker.edge import calls
from gpu_worker.edge.choices import decode_choice, resume_choices
from gpu_worker.edge.inflight import Entry, Inflight
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.redis_errors import Kind, classify
from gpu_worker.edge.redis_io import RedisIO
from gpu_worker.edge.scripts import Begun
from gpu_worker.metrics import DISABLED, WorkerMetrics  # ops: metrics
from gpu_worker.outputs import RequestDelta
from shared import codec, errors, keys
from shared.errors import ProtocolError
from shared.failures import is_rejection  # ops: a rejection is not a dead letter
from shared.protocol import Choice, Request
from shared.scan import scan

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    entry: Entry
    request: Request | None
    tenant: str | None = None
    request_id: str | None = None
    code: str | None = None  # set: the entry fails (and is dead-lettered)
    message: str = ""


@dataclass
class Accepted:
    """What :func:`accept` made of a read: ``running`` to hand to the engine; ``handback``
    to give back untouched, because ``error`` (a server-wide refusal) stopped them."""

    running: list[Inflight] = field(default_factory=list)
    handback: list[Entry] = field(default_factory=list)
    error: BaseException | None = None


def plan(entry: Entry, options: WorkerOptions) -> _Plan:
    """What to do with one entry. Never raises."""
    raw = entry.payload
    if entry.deliveries > options.max_deliveries:  # before parsing: it may be what kills us
        found = scan(raw)
        return _Plan(entry, None, _tenant(entry, found.tenant), found.request_id, errors.POISON,
                     f"delivered {entry.deliveries} times without finishing "
                     f"(limit {options.max_deliveries})")
    if raw is None:
        return _Plan(entry, None, entry.tenant, None, errors.MALFORMED,
                     f"the entry has no `{keys.STREAM_FIELD}` field")
    try:
        request = codec.decode_request(raw)
    except ProtocolError as exc:
        return _Plan(entry, None, _tenant(entry, exc.tenant), exc.request_id, exc.code,
                     exc.message)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must end this entry only
        logger.exception("decoding entry %s failed", entry.entry_id)
        found = scan(raw)
        return _Plan(entry, None, _tenant(entry, found.tenant), found.request_id, errors.INTERNAL,
                     f"the worker could not decode this entry ({type(exc).__name__})")
    tenant = _tenant(entry, request.tenant)
    if entry.tenant is not None and request.tenant not in (None, entry.tenant):
        return _Plan(entry, None, tenant, request.request_id, errors.TENANT_MISMATCH,
                     f"the request names tenant {request.tenant!r} but was enqueued in the "
                     f"stream of tenant {entry.tenant!r}")
    return _Plan(entry, msgspec.structs.replace(request, tenant=tenant), tenant,
                 request.request_id)


def _tenant(entry: Entry, named: str | None) -> str:
    """The stream's tenant; on the old shared streams, the one the payload names."""
    return entry.tenant or named or keys.DEFAULT_TENANT


async def accept(io: RedisIO, options: WorkerOptions, entries: list[Entry],
                 metrics: WorkerMetrics = DISABLED) -> Accepted:
    """Begin ``entries`` in Redis. Raises only what the BEGIN round-trip itself raises
    (the connection); every per-entry outcome is in the returned :class:`Accepted`."""
    plans = [plan(e, options) for e in entries]
    addressed = [p for p in plans if p.request_id is not None]
    now = time.time()
    replies = await io.run([calls.begin(options, p.tenant, p.request_id, p.entry, now, p.request)
                            for p in addressed]) if addressed else []
    out = Accepted()
    endings: list[tuple[Entry, list[tuple]]] = []  # an entry, and the writes that end it
    for p, reply in zip(addressed, replies):
        if isinstance(reply, Exception) and classify(reply) is not Kind.REQUEST:
            out.handback.append(p.entry)
            out.error = reply
            continue
        ending = _settle(p, reply, options, io.publish_command, now, out, metrics)
        if ending is not None:
            endings.append((p.entry, ending))
    for p in plans:
        if p.request_id is None:
            logger.debug("dead-lettering entry %s of %s: %s: %s", p.entry.entry_id,
                         p.entry.stream, p.code, p.message)
            endings.append((p.entry, [calls.dead_letter(options, p.entry, p.code, p.message)]))
    finished = await _store(io, endings, out, metrics)
    if finished:
        await io.run(calls.ack(options, finished))
    return out


def _settle(p: _Plan, reply, options: WorkerOptions, publish_command: str, now: float,
            out: Accepted, metrics: WorkerMetrics) -> list[tuple] | None:
    """Run the begun request (None), or the writes that end its entry now."""
    dead = ([] if p.code is None or is_rejection(p.code)
            else [calls.dead_letter(options, p.entry, p.code, p.message)])
    try:
        if isinstance(reply, Exception):  # about this request's own keys (a client wrote them)
            raise reply
        begun = Begun.parse(reply)
    except Exception as exc:  # noqa: BLE001 - not begun, so no failure can be stored
        logger.warning("entry %s: request %s cannot be begun: %s", p.entry.entry_id,
                       p.request_id, exc)
        return dead or [calls.dead_letter(options, p.entry, errors.INTERNAL, str(exc))]
    try:
        if begun.status != "ok":
            logger.info("entry %s: request %s is %s; acknowledging without generating",
                        p.entry.entry_id, p.request_id, begun.status)
            return dead
        inf = _inflight(p, begun)
        outcome = _terminal_now(p, inf, begun.cancelled, now, options)
    except Exception as exc:  # noqa: BLE001 - e.g. stored progress a client overwrote
        logger.exception("entry %s: request %s could not be begun", p.entry.entry_id,
                         p.request_id)
        inf = _inflight(_Plan(p.entry, None, p.tenant, p.request_id), begun, progress=False)
        outcome = inf.failure(errors.INTERNAL, f"the request's stored state is unreadable "
                                               f"({type(exc).__name__})")
        dead = [calls.dead_letter(options, p.entry, errors.INTERNAL, str(exc))]
    if outcome is None:
        out.running.append(inf)
        return None
    metrics.on_terminal(outcome, p.tenant)  # ops: metrics
    return [calls.finish(options, publish_command, inf, outcome), *dead]


async def _store(io: RedisIO, endings: list[tuple[Entry, list[tuple]]], out: Accepted,
                 metrics: WorkerMetrics) -> list[Entry]:
    """Run every ending's writes in one round-trip; the entries to acknowledge."""
    flat = [call for _, writes in endings for call in writes]
    results = iter(await io.run(flat)) if flat else iter(())
    finished: list[Entry] = []
    for entry, writes in endings:
        errs = [r for r in (next(results) for _ in writes) if isinstance(r, Exception)]
        refused = [e for e in errs if classify(e) is not Kind.REQUEST]
        if refused:  # not stored: give it back, to be ended when the server takes writes
            out.handback.append(entry)
            out.error = refused[0]
            continue
        for exc in errs:
            logger.error("entry %s: ending write failed: %s", entry.entry_id, exc)
        metrics.on_dead_letter_writes(writes)  # ops: metrics (and a rate-limited line)
        finished.append(entry)
    return finished


def _inflight(p: _Plan, begun: Begun, *, progress: bool = True) -> Inflight:
    request = p.request
    if request is None:  # malformed but addressable: a stand-in, only to store the failure
        request = Request(request_id=p.request_id, tenant=p.tenant, prompt="")
    priors = resume_choices(list(begun.progress), request.n) if progress else [([], "")]
    ended = {c.index: c for c in map(decode_choice, begun.ended_choices)
             if c.index < request.n} if progress else {}
    for i, (ids, text) in enumerate(priors):  # generated everything, died before ending it
        if i not in ended and len(ids) >= request.max_tokens:
            ended[i] = Choice(index=i, finish_reason="length", text=text, token_ids=ids)
    (token_ids, text), *others = priors
    return Inflight(request=request, entry=p.entry, owner=begun.owner,
                    prior_token_ids=token_ids, prior_text=text, prior_choices=others, ended=ended,
                    first_start=begun.first_start, first_token_at=begun.first_token_at)


def _terminal_now(p: _Plan, inf: Inflight, cancelled: bool, now: float,
                  options: WorkerOptions):
    """The terminal event due before any engine work, or None to run the request."""
    if p.code is not None:
        logger.debug("failing request %s (%s): %s", p.request_id, p.code, p.message)
        return inf.failure(p.code, p.message)
    if cancelled:
        reason = "cancelled"
    elif p.request.deadline is not None and p.request.deadline <= now:
        reason = "timeout"
    elif inf.all_ended:
        reason = "length"  # a previous worker generated everything but died before finishing
    else:
        return None
    delta = RequestDelta(request_id=inf.key, new_token_ids=[], new_text="", finished=True,
                         finish_reason=reason, num_output_tokens=len(inf.prior_token_ids))
    return inf.terminal_event(delta, options.worker_id)
