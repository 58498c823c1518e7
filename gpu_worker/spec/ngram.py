"""Prompt-lookup drafting: continue the most recent earlier occurrence of the last n tokens."""
from __future__ import annotations

import numpy as np

from gpu_worker.spec.speculator import DraftItem


class NgramProposer:
    """Drafts by matching the request's last ``n`` tokens (longest n first) against its own
    prompt and output, and proposing what followed the most recent match. No model, so a
    draft costs microseconds and needs no KV slots of its own."""

    name = "ngram"
    uses_model = False
    observe = None

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, items: list[DraftItem]) -> dict[str, list[int]]:
        return {it.request.request_id: self._continuation(it.request.token_ids, it.k) for it in items}

    def _continuation(self, token_ids: list[int], k: int) -> list[int]:
        if k <= 0 or len(token_ids) < self.min_n + 1:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start:start + k].tolist()
        return []
