"""Decides who drafts how much each step, runs the proposer (every one speaks
:class:`Proposer`), and keeps the counters. It only proposes: the drafts go to
``Scheduler.set_drafts``, and ``Scheduler.schedule`` allocated a model drafter's slots."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpu_worker.request import Request
from gpu_worker.spec.adaptive import AdaptiveDepth

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftItem:
    request: Request        # decoding: every token but its last is computed
    k: int                  # drafts wanted, >= 1
    block_ids: list[int]    # its block table, covering positions up to num_tokens - 2 + k


class Proposer(Protocol):
    """n-gram, draft model or self-draft. ``uses_model``: writes draft K/V into lookahead
    slots (and is timed per token); ``observe``: None, or what the runner must call with
    every target batch (input_ids, positions, plan). ``propose`` may raise."""

    name: str
    uses_model: bool
    observe: Callable | None

    def propose(self, items: list[DraftItem]) -> dict[str, list[int]]: ...


class Speculator:
    def __init__(self, proposer: Proposer, max_k: int, adaptive: bool = True) -> None:
        self.proposer, self.name = proposer, proposer.name
        self.depth = AdaptiveDepth(max_k)
        self.adaptive = adaptive
        self.max_k = max_k
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_verifications = 0      # request-steps that verified at least one draft
        self._proposals = 0             # propose calls (adaptive: a few draft nothing, plain_step_due)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots past the next token the scheduler must give each decoding request."""
        return self.max_k if self.proposer.uses_model else 0

    def record(self, num_drafted: dict[str, int], num_accepted: dict[str, int]) -> None:
        for rid, drafted in num_drafted.items():
            accepted = num_accepted.get(rid, 0)
            self.depth.record(rid, drafted, accepted)
            self.num_drafted += drafted
            self.num_accepted += accepted
            self.num_verifications += drafted > 0

    def observe_step(self, num_tokens: int, seconds: float, drafted: bool = False) -> None:
        """A decode step's size and time (``drafted``: it verified drafts)."""
        self.depth.observe(num_tokens, seconds, drafted)

    def forget(self, request_id: str) -> None:
        self.depth.forget(request_id)

    def propose(self, decoding: list[tuple[Request, list[int]]]) -> tuple[dict[str, list[int]], list[tuple[Request, Exception]]]:
        """Drafts for decoding requests (with their block tables), and the requests whose own
        proposal raised, with the error, for the caller to fail. A proposal that raises is
        retried one request at a time; when every request fails alone the drafter itself is
        broken, and this step goes without drafts (drafting is optional)."""
        self._proposals += 1
        if self.adaptive and self.depth.plain_step_due(self._proposals):
            return {}, []   # a plain step now and then keeps AdaptiveDepth's plain line measured
        items = []
        for req, block_ids in decoding:
            if not req.params.speculative:
                continue
            k = self.depth.depth(req.request_id, len(decoding)) if self.adaptive else self.max_k
            if (k := min(k, req.max_num_drafts)) > 0:
                items.append(DraftItem(req, k, block_ids))
        judged = self.adaptive and not self.depth.drafted_step_due(self._proposals)
        if not items or (judged and self.proposer.uses_model
                         and not self.depth.worth_it(len(decoding), {it.request.request_id: it.k for it in items},
                                                     unpaid=True)):
            return {}, []   # a model drafter's time is not spent on drafts the step would drop
        t0 = time.perf_counter()
        try:
            drafts, failed = self.proposer.propose(items), []
        except Exception:
            logger.warning("drafting %d requests failed; retrying one by one", len(items), exc_info=True)
            drafts, failed = self._propose_alone(items)
        _keep_grammar_valid(items, drafts)
        total = sum(len(d) for d in drafts.values())
        if total and self.proposer.uses_model:
            per_token = (time.perf_counter() - t0) / total
            d = self.depth
            d.draft_seconds_per_token = 0.8 * d.draft_seconds_per_token + 0.2 * per_token if d.draft_seconds_per_token else per_token
        drafted = {rid: len(d) for rid, d in drafts.items() if d}
        if judged and drafted and not self.depth.worth_it(len(decoding), drafted):
            return {}, failed   # the step runs plain: these drafts would cost it more than they add
        return drafts, failed

    def _propose_alone(self, items: list[DraftItem]) -> tuple[dict[str, list[int]], list[tuple[Request, Exception]]]:
        drafts, failed = {}, []
        for item in items:
            try:
                drafts.update(self.proposer.propose([item]))
            except Exception as exc:  # noqa: BLE001 - pinned on this request, or on the drafter below
                failed.append((item.request, exc))
        if len(failed) == len(items):
            logger.error("the drafter fails on every request (%r); this step goes without drafts", failed[0][1])
            return {}, []
        return drafts, failed

    def stats(self) -> dict:
        return {"spec_drafted_tokens": {self.name: self.num_drafted},
                "spec_accepted_tokens": {self.name: self.num_accepted},
                "spec_acceptance_rate": self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
                "spec_mean_accepted_length": (self.num_accepted / self.num_verifications
                                              if self.num_verifications else 0.0)}


def _keep_grammar_valid(items: list[DraftItem], drafts: dict[str, list[int]]) -> None:
    """Cut a structured request's drafts at the first token its grammar refuses (it could
    never be accepted; the matcher is rolled back to where it was)."""
    for item in items:
        grammar, rid = item.request.grammar, item.request.request_id
        if grammar is not None and drafts.get(rid):
            drafts[rid] = drafts[rid][:grammar.valid_prefix(drafts[rid])]
