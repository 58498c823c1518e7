"""Token masks of a batch's constrained rows, applied to their logits in place.

A request verifying drafts has one row per draft position; row ``j`` is sampled after its
first ``j`` drafts, so its mask is the grammar's after those drafts: the matcher is advanced
through them (stopping at the first the grammar refuses, or at EOS: the rows after it are
never used, since no valid token equals that draft) and rolled back afterwards. The scheduler then feeds
only the tokens the step kept.
"""
from __future__ import annotations

import numpy as np
import torch


def apply_grammar_masks(logits: torch.Tensor, rows: list) -> bool:
    """Mask every row whose ``grammar`` is set; logits: [n, vocab] float32 on the CPU,
    changed in place. False (nothing done) if no row is constrained."""
    constrained = [i for i, r in enumerate(rows) if r.grammar is not None]
    if not constrained:
        return False
    vocab = logits.shape[-1]
    words = np.full((len(constrained), (vocab + 31) // 32), -1, dtype=np.int32)   # numpy: no OMP fork
    bitmask = torch.from_numpy(words)
    advanced: dict[int, list] = {}          # id(grammar) -> [grammar, drafts fed, still valid]
    for k, i in enumerate(constrained):
        r = rows[i]
        g = advanced.setdefault(id(r.grammar), [r.grammar, 0, True])
        if r.num_drafts and g[2]:           # this row comes after draft j-1: feed it
            accepted = r.grammar.accept(r.output_token_ids[-1])
            g[1] += accepted
            g[2] = accepted and not r.grammar.is_terminated   # after EOS the request ends
        if g[2]:
            r.grammar.fill(bitmask, k)      # else: never sampled (its draft was refused)
    for grammar, fed, _ in advanced.values():
        grammar.rollback(fed)
    # Bit j of word w is token 32 w + j: little-endian bytes, little bit order.
    refused = ~np.unpackbits(words.view(np.uint8), axis=1, count=vocab, bitorder="little").view(bool)
    values = logits.numpy()
    for k, i in enumerate(constrained):
        np.copyto(values[i], -np.inf, where=refused[k])
    return True
