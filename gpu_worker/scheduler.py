"""Continuous batching with one token budget per step (pure Python, no torch).

There are no prefill and decode phases: every scheduled request catches its
``num_computed_tokens`` up towards its token count (plus draft tokens). A long prompt
is prefilled in chunks beside running decodes; a prefix-cache hit just starts the count
higher. When blocks run out, the lowest-priority, newest running request is preempted
(its blocks freed, to be recomputed later).
"""
from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field

from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.request import Request, Status

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
    num_preempted: int = 0


def _order(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []      # sorted by (priority, arrival)
        self.running: list[Request] = []
        self.finished: list[Request] = []     # aborted, timed out or failed: apply_step reports them
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
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
        otherwise); the next ``apply_step`` reports it with ``finish_reason="error"``."""
        self.finish(req, "error")
        req.finish_reason, req.stop_reason = "error", None
        req.error_code, req.error_message = code, message
        self.finished.append(req)
        logger.warning("request %s failed: %s: %s", req.request_id, code, message)

    def abort(self, request_id: str, reason: str) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        self.finish(req, reason)
        self.finished.append(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.finished)

    # -- admission -----------------------------------------------------------------
    def reserved_blocks(self) -> int:
        """Blocks the requests already accepted may still claim until they finish."""
        total = 0
        for req in self.requests.values():
            need = self.kv.blocks_for(req.num_prompt_tokens + req.max_output_tokens)
            total += max(0, need - self.kv.num_blocks_of(req.request_id))
        return total

    def can_admit(self, num_tokens: int) -> bool:
        return self.kv.blocks_for(num_tokens) <= self.kv.num_free_blocks - self.reserved_blocks()

    # -- the step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
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
        out.num_preempted = sum(1 for r in self.waiting if r.status is Status.PREEMPTED)
        return out

    def _allocate_or_preempt(self, req: Request, num_new: int) -> list[int] | None:
        while True:
            block_ids = self.kv.allocate_slots(req.request_id, req.num_computed_tokens + num_new)
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
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hits, num_cached = self.kv.get_computed_blocks(req.token_ids)
            num_new = min(req.num_tokens - num_cached, budget)
            block_ids = self.kv.allocate_slots(req.request_id, num_cached + num_new, hits)
            if block_ids is None:
                break
            self.waiting.pop(0)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_cached
            req.num_computed_tokens = num_cached
            req.status = Status.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, num_new, 0, block_ids))
            budget -= num_new
        return budget

    def _expire_deadlines(self) -> None:
        now = time.time()
        for req in [r for r in self.requests.values() if r.deadline is not None and r.deadline <= now]:
            self.finish(req, "timeout")
            self.finished.append(req)
