"""Continuous batching with one token budget per step (pure Python, no torch).

No prefill and decode phases: every scheduled request catches ``num_computed_tokens`` up
towards its token count (plus drafts), so long prompts are prefilled in chunks beside
decodes and a prefix-cache hit just starts the count higher. When blocks run out, the
lowest-priority, newest running request is preempted (blocks freed, recomputed later).
Only the scheduler moves a request's counters and allocates its blocks: ``schedule()``
(lookahead slots for a model drafter included), ``update_from_output()``, ``set_drafts()``;
``fail()``/``abort()`` end a request early, reported by the next ``update_from_output()``.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_worker.errors import INTERNAL, InvalidRequestError
from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.outputs import RequestDelta
from gpu_worker.request import Request, Status
from gpu_worker.stop import check_stop

if TYPE_CHECKING:
    from gpu_worker.runner import RunnerOutput

logger = logging.getLogger(__name__)


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int           # tokens fed this step, draft tokens included
    num_spec_tokens: int          # of which drafts
    block_ids: list[int]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0


def _order(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_num_batched_tokens: int, max_num_seqs: int,
                 num_lookahead_tokens: int = 0) -> None:
        """``num_lookahead_tokens``: KV slots past a decoding request's next token that a
        model drafter writes its drafts' K/V into (0 for drafters without a model)."""
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.num_lookahead_tokens = num_lookahead_tokens
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []      # sorted by (priority, arrival)
        self.running: list[Request] = []
        self.finished: list[Request] = []     # ended outside a step: the next update reports them
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; a request id already here raises :class:`InvalidRequestError`."""
        if req.request_id in self.requests:
            raise InvalidRequestError("duplicate_request_id", f"request {req.request_id!r} is already running")
        self.requests[req.request_id] = req
        self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        keys = [_order(r) for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, _order(req)), req)

    def finish(self, req: Request, reason: str, stop_reason: str | int | None = None) -> None:
        """End a request now: leave the queues and free its blocks."""
        if req.is_finished:
            return
        if req.status is Status.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status, req.finish_reason, req.stop_reason = Status.FINISHED, reason, stop_reason
        req.spec_token_ids = []
        self.kv.free(req.request_id)
        self.requests.pop(req.request_id, None)

    def fail(self, req: Request, code: str, message: str) -> None:
        """End a request on an error of its own (blocks freed, even if it had just finished
        otherwise); the next update reports it with ``finish_reason="error"``."""
        self.finish(req, "error")
        req.finish_reason, req.stop_reason = "error", None
        req.error_code, req.error_message = code, message
        self.finished.append(req)
        logger.warning("request %s failed: %s: %s", req.request_id, code, message)

    def abort(self, request_id: str, reason: str) -> bool:
        """End a request now, if it is here; the next update reports it."""
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req, reason)
            self.finished.append(req)
        return req is not None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.finished)

    # -- admission -----------------------------------------------------------------
    def reserved_blocks(self) -> int:
        """Blocks the requests already accepted may still claim until they finish."""
        kv = self.kv
        return sum(max(0, kv.blocks_for(r.num_prompt_tokens + r.max_output_tokens) - kv.num_blocks_of(r.request_id))
                   for r in self.requests.values())

    def can_admit(self, num_tokens: int) -> bool:
        return self.kv.blocks_for(num_tokens) <= self.kv.num_free_blocks - self.reserved_blocks()

    # -- the step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """This step's requests and token counts, their blocks allocated (preempting if need be)."""
        self._expire_deadlines()
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=_order)
        preempted = False
        for req in list(self.running):
            if req.status is not Status.RUNNING or budget == 0:
                continue
            num_new = min(req.num_tokens_with_spec - req.num_computed_tokens, budget)
            block_ids = self._allocate_or_preempt(req, num_new)
            if block_ids is None:
                preempted = True
                continue
            num_spec = max(0, req.num_computed_tokens + num_new - req.num_tokens)
            del req.spec_token_ids[num_spec:]   # drafts cut by the budget are dropped
            out.scheduled.append(ScheduledRequest(req, num_new, num_spec, block_ids))
            budget -= num_new
        if not preempted:
            budget = self._admit_waiting(out, budget)
        out.num_batched_tokens = self.max_num_batched_tokens - budget
        return out

    def _slots_needed(self, req: Request, num_computed: int, num_new: int) -> int:
        """Slots for this step's tokens, plus the drafter's lookahead when the step brings the
        request to decoding (never past the most tokens it can have: admission counted those)."""
        end = num_computed + num_new
        if not self.num_lookahead_tokens or not req.params.speculative or end < req.num_tokens:
            return end
        return max(end, min(end + self.num_lookahead_tokens, req.num_prompt_tokens + req.max_output_tokens))

    def _allocate_or_preempt(self, req: Request, num_new: int) -> list[int] | None:
        while True:
            block_ids = self.kv.allocate_slots(
                req.request_id, self._slots_needed(req, req.num_computed_tokens, num_new))
            if block_ids is not None:
                return block_ids
            victim = self.running[-1]   # sorted: lowest priority, newest last
            self._preempt(victim)
            if victim is req:
                return None

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req.request_id)
        req.status, req.num_computed_tokens = Status.PREEMPTED, 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(req)
        logger.debug("preempted %s", req.request_id)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[i]
            if not self._grammar_ready(req):   # compiling: the next one may go first
                i += 0 if req.is_finished else 1
                continue
            hits, num_cached = self.kv.get_computed_blocks(req.token_ids)
            num_new = min(req.num_tokens - num_cached, budget)
            block_ids = self.kv.allocate_slots(req.request_id, self._slots_needed(req, num_cached, num_new), hits)
            if block_ids is None:
                break
            self.waiting.pop(i)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_cached
            req.num_computed_tokens = num_cached
            req.status = Status.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, num_new, 0, block_ids))
            budget -= num_new
        return budget

    def _grammar_ready(self, req: Request) -> bool:
        """Whether a structured request's matcher is ready (fed its resumed output); a grammar
        that failed to compile (or refuses the resumed tokens) fails the request."""
        if req.grammar_pending is None:
            return True
        try:
            state = req.grammar_pending.poll()
            if state is not None and not state.feed(req.output_token_ids):
                raise InvalidRequestError("invalid_resume", "the resumed tokens do not match the grammar")
        except InvalidRequestError as exc:
            self.fail(req, exc.code, exc.message)
            return False
        if state is None:
            return False
        req.grammar, req.grammar_pending = state, None
        if state.is_terminated:             # resumed with its whole output (EOS included)
            self.finish(req, "stop")
            self.finished.append(req)
            return False
        return True

    def _expire_deadlines(self) -> None:
        now = time.time()
        for req in [r for r in self.requests.values() if r.deadline is not None and r.deadline <= now]:
            self.finish(req, "timeout")
            self.finished.append(req)

    # -- after the step ------------------------------------------------------------
    def update_from_output(self, sched_out: SchedulerOutput, run_out: RunnerOutput) -> list[RequestDelta]:
        """Apply one step's sampled tokens: advance the computed counts, roll back rejected
        drafts, register full blocks for prefix caching, end requests that stop. Returns a
        delta per request that produced tokens or ended (also those ended since the last
        call). A request whose update raises fails alone; the other deltas still come."""
        deltas: list[RequestDelta] = []
        for s in sched_out.scheduled:
            if s.request.is_finished:       # aborted, or failed while the step ran
                continue
            try:
                delta = self._update_one(s, run_out)
            except Exception as exc:
                logger.exception("updating %s failed", s.request.request_id)
                self.fail(s.request, INTERNAL, f"postprocessing failed: {exc!r}")
                continue
            if delta is not None:
                deltas.append(delta)
        deltas += [req.take_delta([]) for req in self.finished]
        self.finished = []
        return deltas

    def _update_one(self, s: ScheduledRequest, run_out: RunnerOutput) -> RequestDelta | None:
        req, rid = s.request, s.request.request_id
        sampled = run_out.sampled.get(rid)
        # Drafts beyond the accepted ones were computed into KV slots: roll them back.
        num_rejected = s.num_spec_tokens - (len(sampled) - 1 if sampled else 0)
        req.num_computed_tokens += s.num_new_tokens - num_rejected
        req.spec_token_ids = []
        if num_rejected:
            self.kv.trim(rid, self._slots_needed(req, req.num_computed_tokens, 1))
        if not sampled:                     # a prefill chunk that did not reach the end
            self.kv.cache_computed(rid, req.token_ids, req.num_computed_tokens)
            return None
        new_tokens, ended = [], None
        for tok in sampled:
            if req.grammar is not None and not req.grammar.accept(tok):
                raise RuntimeError(f"token {tok} breaks the request's grammar")
            req.append_output(tok)
            new_tokens.append(tok)
            stop_string = req.detokenizer.push([tok], check_stop=req.num_output_tokens >= req.params.min_tokens)
            ended = check_stop(req, tok, stop_string)
            if ended is None and req.grammar is not None and req.grammar.is_terminated:
                ended = ("stop", None)      # the grammar is complete: min_tokens does not hold it
            if ended is not None:
                break
        # After appending: accepted drafts are computed tokens that only now have ids.
        self.kv.cache_computed(rid, req.token_ids, min(req.num_computed_tokens, req.num_tokens))
        if ended is not None:
            self.finish(req, *ended)
        logprobs = run_out.logprobs.get(rid)
        return req.take_delta(new_tokens, logprobs[:len(new_tokens)] if logprobs is not None else None)

    def decoding(self) -> list[tuple[Request, list[int]]]:
        """Running requests whose next step feeds one token (they may draft), each with its
        block table (lookahead slots included)."""
        return [(r, self.kv.block_ids(r.request_id)) for r in self.running if r.is_decoding]

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        """Take drafts for the next step. Drafts of requests no longer decoding are dropped,
        and none go past a request's output budget (the bonus token needs the last slot)."""
        for rid, draft in drafts.items():
            if (req := self.requests.get(rid)) is not None and req.is_decoding:
                req.spec_token_ids = list(draft[:req.max_num_drafts])

    @contextmanager
    def scratch_step(self, req: Request) -> Iterator[SchedulerOutput | None]:
        """A one-token step of ``req`` (never queued) in a scratch block freed afterwards;
        None when no block is free."""
        block_ids = self.kv.allocate_slots(req.request_id, 1)
        try:
            yield None if block_ids is None else SchedulerOutput([ScheduledRequest(req, 1, 0, block_ids)], 1)
        finally:
            self.kv.free(req.request_id)
