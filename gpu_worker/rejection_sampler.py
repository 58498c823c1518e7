"""Lossless verification of draft tokens.

Row ``j`` of a request's logits is the target's distribution for the token after the
``j``-th draft. Greedy requests keep the longest prefix of drafts equal to the target's
argmax, then add the target's own next token. Sampled requests use rejection sampling:
draft ``d`` is kept with probability ``min(1, p(d) / q(d))``; on rejection the token is
drawn from ``max(0, p - q)`` renormalised, so the output is distributed exactly as the
target's (Leviathan et al., Chen et al. 2023). Every drafter here is deterministic (n-gram,
greedy draft models), so ``q`` is one-hot: keep ``d`` with probability ``p(d)``, else draw
from ``p`` without ``d``. Seeded requests draw from (seed, position), as in the plain sampler.
"""
from __future__ import annotations

import torch

from gpu_worker.sampler import Sampler, SamplingRow, gather_logprobs, raw_logprobs_for, row_seed
from gpu_worker.structured.masks import apply_grammar_masks


def verify_drafts(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow],
                  logits_rows: list, out) -> None:
    """logits: [num_rows, vocab] raw; fills out.sampled / num_drafted / num_accepted / logprobs."""
    raw = raw_logprobs_for(logits, rows)
    apply_grammar_masks(logits, rows)   # row j after j drafts: a refused draft is rejected
    processed = sampler.processed_logits(logits.clone(), rows)
    greedy_ids = processed.argmax(dim=-1).tolist()
    sampled_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    probs = {}
    if sampled_rows:
        p = sampler.probs(processed[sampled_rows], [rows[i] for i in sampled_rows])
        probs = {row: p[k] for k, row in enumerate(sampled_rows)}
    first = 0   # the request's first row in rows and logits
    for s, _, n in logits_rows:
        req = s.request
        drafts = req.spec_token_ids[:n - 1]
        tokens = []
        for j in range(n):
            row = first + j
            if rows[row].params.greedy:
                tokens.append(greedy_ids[row])
                if j == n - 1 or greedy_ids[row] != drafts[j]:
                    break
                continue
            token, accepted = _sample_or_accept(sampler, probs[row], rows[row], drafts[j] if j < n - 1 else None)
            tokens.append(token)
            if not accepted:
                break
        rid = req.request_id
        out.sampled[rid] = tokens
        out.num_drafted[rid] = n - 1
        out.num_accepted[rid] = len(tokens) - 1
        if raw is not None:
            kept = slice(first, first + len(tokens))
            out.logprobs[rid] = gather_logprobs(raw[kept], tokens, rows[kept])
        first += n


def _sample_or_accept(sampler: Sampler, p: torch.Tensor, row: SamplingRow, draft: int | None) -> tuple[int, bool]:
    """(token, draft accepted) for one row; p: [vocab] target probabilities. ``draft is
    None`` means the bonus position."""
    gen = _generator(sampler, row)
    if draft is not None:
        if float(torch.rand((), generator=gen)) < float(p[draft]):
            return draft, True
        residual = p.clone()
        residual[draft] = 0.0
        total = float(residual.sum())
        p = residual / total if total > 0 else p
    noise = torch.empty_like(p).exponential_(generator=gen)
    return int((p / noise).argmax()), False


def _generator(sampler: Sampler, row: SamplingRow) -> torch.Generator:
    if row.params.seed is None:
        return sampler.generator
    return torch.Generator().manual_seed(row_seed(row.params.seed, row.position) ^ 0x5DEECE66D)
