"""Turns a SchedulerOutput into flat batch tensors, runs the model, samples and verifies.

Decode rows (one new token, no drafts) go first, sorted by context length so the CPU
attention can batch them with little padding; prefill chunks and draft-verification
rows follow. Logits are computed only at positions that produce a token.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial

import torch

from gpu_worker.cpu_tuning import zeros_on_huge_pages
from gpu_worker.model.attention import AttentionMetadata
from gpu_worker.model.llama import LlamaForCausalLM
from gpu_worker.outputs import TokenLogprob
from gpu_worker.rejection_sampler import verify_drafts
from gpu_worker.sampler import Sampler, SamplingRow
from gpu_worker.scheduler import ScheduledRequest, SchedulerOutput

logger = logging.getLogger(__name__)


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
    order: list[ScheduledRequest]
    input_ids: torch.Tensor         # [num_tokens]
    positions: torch.Tensor         # [num_tokens]
    meta: AttentionMetadata
    logits_rows: list[tuple[ScheduledRequest, int, int]]   # (req, first row, num rows) in logits


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, *,
                 dtype: torch.dtype = torch.float32, seed: int = 0,
                 device: torch.device = torch.device("cpu")) -> None:
        cfg = model.cfg
        self.model, self.block_size, self.device = model, block_size, device
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        # Zeroed, not empty: masked-out slots still flow through attention (as 0 * value).
        zeros = zeros_on_huge_pages if device.type == "cpu" else partial(torch.zeros, device=device)
        self.kv_caches = [(zeros(shape, dtype=dtype), zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)]
        self.sampler = Sampler(seed)
        self.drafter = None     # a model drafter that must see every target batch (set by the engine)
        self.graphs = None      # CUDA graphs for pure-decode steps (set by the engine on CUDA)

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        out = RunnerOutput()
        if not sched.scheduled:
            return out
        batch = self.prepare(sched)
        plan = None
        if self.graphs is not None and self.drafter is None and self.graphs.can_run(batch.meta):
            hidden = self.graphs.run(batch.input_ids, batch.positions, batch.meta)
        else:
            plan = self.model.ops.plan_attention(batch.meta)
            hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, plan)
        if self.drafter is not None:
            self.drafter.observe(batch.input_ids, batch.positions, plan)
        if not batch.logits_rows:
            return out
        index = torch.tensor([row for _, first, n in batch.logits_rows for row in range(first, first + n)],
                             device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, index)).cpu()
        self.sample(batch, logits, out)
        return out

    def prepare(self, sched: SchedulerOutput) -> _Batch:
        """Flat batch tensors and attention metadata for one step."""
        decodes = sorted((s for s in sched.scheduled if s.num_new_tokens == 1 and not s.num_spec_tokens),
                         key=lambda s: s.request.num_computed_tokens)
        others = [s for s in sched.scheduled if s.num_new_tokens != 1 or s.num_spec_tokens]
        order = decodes + others
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        seq_lens, query_lens, logits_rows = [], [], []
        for s in order:
            req, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            tokens = req.token_ids + req.spec_token_ids if s.num_spec_tokens else req.token_ids
            ids.extend(tokens[start:start + n])
            positions = range(start, start + n)
            pos.extend(positions)
            table = s.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in positions)
            end = start + n
            if end >= req.num_tokens:   # the chunk reaches the last real token: sample
                num_rows = end - req.num_tokens + 1
                logits_rows.append((s, len(ids) - num_rows, num_rows))
            seq_lens.append(end)
            query_lens.append(n)
        max_blocks = max(len(s.block_ids) for s in order)
        tables = torch.zeros(len(order), max_blocks, dtype=torch.long)
        for i, s in enumerate(order):
            tables[i, :len(s.block_ids)] = torch.tensor(s.block_ids)
        dev = self.device
        meta = AttentionMetadata(torch.tensor(slots, device=dev), tables.to(dev), seq_lens, query_lens,
                                 len(decodes), bs)
        return _Batch(order, torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta, logits_rows)

    def sample(self, batch: _Batch, logits: torch.Tensor, out: RunnerOutput) -> None:
        """Sample (or verify drafts) at every logits row of the batch into ``out``."""
        rows: list[SamplingRow] = []
        for s, _, n in batch.logits_rows:
            req = s.request
            for j in range(n):
                outputs = req.output_token_ids + req.spec_token_ids[:j]
                rows.append(SamplingRow(req.params, req.num_tokens + j, req.prompt_token_ids,
                                        outputs, req.eos_token_ids))
        plain = all(n == 1 for _, _, n in batch.logits_rows)
        if plain:
            token_ids, logprobs = self.sampler.sample(logits, rows)
            for k, (s, _, _) in enumerate(batch.logits_rows):
                out.sampled[s.request.request_id] = [token_ids[k]]
                if logprobs is not None:
                    out.logprobs[s.request.request_id] = [logprobs[k]]
            return
        verify_drafts(self.sampler, logits, rows, batch.logits_rows, out)
