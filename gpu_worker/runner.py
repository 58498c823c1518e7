"""Turns a SchedulerOutput into flat batch tensors, runs the model, samples and verifies.

Decode rows (one new token, no drafts) go first, sorted by context length so the CPU
attention can batch them with little padding; prefill chunks and draft-verification
rows follow. Logits are computed only at positions that produce a token.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from gpu_worker.cpu_tuning import zeros_on_huge_pages
from gpu_worker.model.attention import AttentionMetadata, build_attention_metadata
from gpu_worker.model.config import ModelConfig
from gpu_worker.model.llama import KVCache, LlamaForCausalLM
from gpu_worker.outputs import TokenLogprob
from gpu_worker.rejection_sampler import verify_drafts
from gpu_worker.sampler import Sampler, SamplingRow, argmax_only
from gpu_worker.scheduler import ScheduledRequest, SchedulerOutput

if TYPE_CHECKING:
    from gpu_worker.model.cuda_graphs import DecodeGraphs


@dataclass
class RunnerOutput:
    sampled: dict[str, list[int]] = field(default_factory=dict)        # accepted + bonus tokens
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
    num_drafted: dict[str, int] = field(default_factory=dict)
    num_accepted: dict[str, int] = field(default_factory=dict)

    def update(self, other: RunnerOutput) -> None:
        """Take in the results of another batch of the same step (other requests)."""
        for name in ("sampled", "logprobs", "num_drafted", "num_accepted"):
            getattr(self, name).update(getattr(other, name))


@dataclass
class _Batch:
    input_ids: torch.Tensor         # [num_tokens]
    positions: torch.Tensor         # [num_tokens]
    meta: AttentionMetadata
    logits_rows: list[tuple[ScheduledRequest, int, int]]   # (req, first row, num rows) in logits
    logits_index: torch.Tensor      # [num_logits_rows] int64: the rows of the batch that sample


def allocate_kv_caches(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device, *, huge_pages: bool = True) -> list[KVCache]:
    """One (K, V) pair per layer, each [num_blocks, block_size, num_kv_heads, head_dim]; on
    the CPU on transparent huge pages unless ``huge_pages`` is False."""
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    # Zeroed, not empty: masked-out slots still flow through attention (as 0 * value).
    zeros = zeros_on_huge_pages if device.type == "cpu" and huge_pages else partial(torch.zeros, device=device)
    return [(zeros(shape, dtype=dtype), zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)]


class ModelRunner:
    """Built whole, never rewired: the model, its KV caches, optional decode graphs (used
    for steps they can run) and an optional ``observe(input_ids, positions, plan)`` that
    must see every batch (a draft model keeping its own KV cache in step; such a runner
    takes no graphs, which produce no plan)."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], block_size: int, *, seed: int = 0,
                 graphs: DecodeGraphs | None = None, observe: Callable | None = None) -> None:
        if graphs is not None and observe is not None:
            raise ValueError("graph steps make no attention plan to observe")
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.device = kv_caches[0][0].device
        self.sampler = Sampler(seed)
        self.graphs, self.observe = graphs, observe

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        out = RunnerOutput()
        if not sched.scheduled:
            return out
        batch = self.prepare(sched)
        if self.graphs is not None and self.graphs.can_run(batch.meta):
            hidden = self.graphs.run(batch.input_ids, batch.positions, batch.meta)
            hidden = hidden.index_select(0, batch.logits_index)
        else:
            plan = self.model.ops.plan_attention(batch.meta)
            # Only the rows that sample come out of the model: the last layer skips the others'
            # output projection and MLP (most of a prefill chunk's rows).
            every = batch.logits_index.shape[0] == batch.input_ids.shape[0]   # then it is 0..n-1
            hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, plan,
                                keep=None if every else batch.logits_index)
            if self.observe is not None:
                self.observe(batch.input_ids, batch.positions, plan)
        if batch.logits_rows:
            if not self.sample_greedy(batch, hidden, out):
                self.sample(batch, self.model.compute_logits(hidden).cpu(), out)
        return out

    def sample_greedy(self, batch: _Batch, hidden: torch.Tensor, out: RunnerOutput) -> bool:
        """When every row of the batch takes the argmax of its raw logits (``argmax_only``, no
        drafts to verify) and the model's greedy head decides them (``greedy_tokens``: the
        same tokens without the full logits), their tokens into ``out``. Whether it did."""
        if getattr(self.model, "greedy_head", None) is None or not all(
                n == 1 and argmax_only(s.request.params, s.request.grammar) for s, _, n in batch.logits_rows):
            return False
        tokens = self.model.greedy_tokens(hidden)
        if tokens is None:
            return False
        for (s, _, _), token in zip(batch.logits_rows, tokens):
            out.sampled[s.request.request_id] = [token]
        return True

    def prepare(self, sched: SchedulerOutput) -> _Batch:
        """Flat batch tensors and attention metadata for one step."""
        decodes = sorted((s for s in sched.scheduled if s.num_new_tokens == 1 and not s.num_spec_tokens),
                         key=lambda s: s.request.num_computed_tokens)
        order = decodes + [s for s in sched.scheduled if s.num_new_tokens != 1 or s.num_spec_tokens]
        ids: list[int] = []
        pos: list[int] = []
        logits_rows = []
        for s in order:
            req, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            tokens = req.token_ids + req.spec_token_ids if s.num_spec_tokens else req.token_ids
            ids.extend(tokens[start:start + n])
            pos.extend(range(start, start + n))
            if start + n >= req.num_tokens:   # the chunk reaches the last real token: sample
                num_rows = start + n - req.num_tokens + 1
                logits_rows.append((s, len(ids) - num_rows, num_rows))
        meta = build_attention_metadata([s.block_ids for s in order],
                                        [s.request.num_computed_tokens + s.num_new_tokens for s in order],
                                        [s.num_new_tokens for s in order], self.block_size, self.device)
        index = [row for _, first, n in logits_rows for row in range(first, first + n)]
        dev = self.device
        return _Batch(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta, logits_rows,
                      torch.tensor(index, dtype=torch.long, device=dev))

    def sample(self, batch: _Batch, logits: torch.Tensor, out: RunnerOutput) -> None:
        """Sample (or verify drafts) at every logits row of the batch into ``out``.
        logits: [num_logits_rows, vocab] float32 on the CPU."""
        rows: list[SamplingRow] = []
        for s, _, n in batch.logits_rows:
            req = s.request
            for j in range(n):
                outputs = req.output_token_ids + req.spec_token_ids[:j]
                rows.append(SamplingRow(req.params, req.num_tokens + j, req.prompt_token_ids,
                                        outputs, req.eos_token_ids, req.grammar, j))
        if all(n == 1 for _, _, n in batch.logits_rows):   # no drafts to verify
            token_ids, logprobs = self.sampler.sample(logits, rows)
            for k, (s, _, _) in enumerate(batch.logits_rows):
                out.sampled[s.request.request_id] = [token_ids[k]]
                if logprobs is not None:
                    out.logprobs[s.request.request_id] = [logprobs[k]]
            return
        verify_drafts(self.sampler, logits, rows, batch.logits_rows, out)
