"""Decides who drafts how much each step, runs the proposer, and keeps the counters."""
from __future__ import annotations

import logging
import time

from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.request import Request
from gpu_worker.spec.adaptive import AdaptiveDepth

logger = logging.getLogger(__name__)


class Speculator:
    def __init__(self, proposer, kv: KVCacheManager, max_k: int, adaptive: bool = True) -> None:
        self.proposer, self.kv = proposer, kv
        self.name = proposer.name
        self.depth = AdaptiveDepth(max_k)
        self.adaptive = adaptive
        self.max_k = max_k
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_verifications = 0      # request-steps that verified at least one draft

    def record(self, num_drafted: dict[str, int], num_accepted: dict[str, int]) -> None:
        for rid, drafted in num_drafted.items():
            accepted = num_accepted.get(rid, 0)
            self.depth.record(rid, drafted, accepted)
            self.num_drafted += drafted
            self.num_accepted += accepted
            self.num_verifications += drafted > 0

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        self.depth.cost.observe(num_tokens, seconds)

    def forget(self, request_id: str) -> None:
        self.depth.forget(request_id)

    def propose(self, running: list[Request], max_model_len: int) -> list[tuple[Request, Exception]]:
        """Set ``spec_token_ids`` on decoding requests (never on ones still prefilling).
        Returns the requests whose own proposal raised, for the caller to fail; a batched
        model proposal that raises costs this step's drafts only (drafting is optional)."""
        decoding = [r for r in running if r.num_computed_tokens == r.num_tokens - 1 and not r.is_finished]
        items = []
        for req in decoding:
            if not req.params.speculative:
                continue
            k = self.depth.depth(req.request_id, len(decoding)) if self.adaptive else self.max_k
            k = min(k, req.max_output_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens)
            if k > 0:
                items.append((req, k))
        if not items:
            return []
        t0 = time.perf_counter()
        failed: list[tuple[Request, Exception]] = []
        if self.proposer.uses_model:
            try:
                drafts = self._propose_with_model(items)
            except Exception:
                logger.exception("draft model failed; this step goes on without drafts")
                drafts = {}
        else:
            drafts = {}
            for req, k in items:
                try:
                    drafts[req.request_id] = self.proposer.propose_one(req.token_ids, k)
                except Exception as exc:
                    failed.append((req, exc))
        for req, _ in items:
            req.spec_token_ids = drafts.get(req.request_id, [])
        total = sum(len(d) for d in drafts.values())
        if total and self.proposer.uses_model:
            per_token = (time.perf_counter() - t0) / total
            d = self.depth
            d.draft_seconds_per_token = 0.8 * d.draft_seconds_per_token + 0.2 * per_token if d.draft_seconds_per_token else per_token
        return failed

    def _propose_with_model(self, items: list[tuple[Request, int]]) -> dict[str, list[int]]:
        ready = []
        for req, k in items:
            # Draft KV goes to positions num_tokens-1 .. num_tokens-2+k: make the table cover them.
            table = self.kv.allocate_slots(req.request_id, req.num_tokens - 1 + k)
            if table is not None:
                ready.append((req, k, table))
        return self.proposer.propose(ready)

    def stats(self) -> dict:
        return {"spec_drafted_tokens": {self.name: self.num_drafted},
                "spec_accepted_tokens": {self.name: self.num_accepted},
                "spec_acceptance_rate": self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
                "spec_mean_accepted_length": (self.num_accepted / self.num_verifications
                                              if self.num_verifications else 0.0)}
