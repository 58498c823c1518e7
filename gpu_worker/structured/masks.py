"""Token masks of a batch's constrained rows, applied to their logits in place.

A request verifying drafts has one row per draft position; row ``j`` is sampled after its
first ``j`` drafts, so its mask is the grammar's after those drafts: the matcher is advanced
through them (stopping at the first the grammar refuses, or at EOS: the rows after it are
never used, since no valid token equals that draft) and rolled back afterwards. The scheduler then feeds
only the tokens the step kept.
"""
from __future__ import annotations

import torch


def apply_grammar_masks(logits: torch.Tensor, rows: list) -> bool:
    """Mask every row whose ``grammar`` is set; logits: [n, vocab]. False if none is."""
    constrained = [i for i, r in enumerate(rows) if r.grammar is not None]
    if not constrained:
        return False
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[-1])
    advanced: dict[int, list] = {}          # id(grammar) -> [grammar, drafts fed, still valid]
    for i in constrained:
        r = rows[i]
        g = advanced.setdefault(id(r.grammar), [r.grammar, 0, True])
        if r.num_drafts and g[2]:           # this row comes after draft j-1: feed it
            accepted = r.grammar.accept(r.output_token_ids[-1])
            g[1] += accepted
            g[2] = accepted and not r.grammar.is_terminated   # after EOS the request ends
        if g[2]:
            r.grammar.fill(bitmask, i)
        else:
            bitmask[i] = bitmask[i - 1]     # never sampled (its draft was refused)
    for grammar, fed, _ in advanced.values():
        grammar.rollback(fed)
    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=constrained)
    return True
