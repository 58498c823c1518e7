"""Paged attention on the CPU with torch ops, planned once per step and shared by all layers.

The KV cache of one layer is a pair of tensors ``[num_blocks, block_size, num_kv_heads,
head_dim]``. A step's tokens are flat and unpadded; decode rows (one query token) come
first, sorted by context length, then prefill chunks. Decodes are run as a few batched
SDPA calls over length buckets (little padding); the ``cpu`` ops backend plans them for the
C kernel of ``kernels/cpu`` instead, which reads every decode row's K/V in place, in one
call per layer (2-5x faster than gathering and SDPA on the machines measured).
Each prefill chunk is one SDPA call, over its own new K/V when it has no cached prefix, else
over its gathered context; the ``cpu`` backend hands all chunks to the C prefill kernel,
which reads the paged context in place (``fleet bench cpu-attention`` compares both).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from gpu_worker.model.ops.cpu_native import loaded_kernels

# A decode bucket grows while its longest context stays within this factor of its shortest.
BUCKET_GROWTH = 1.5


@dataclass(frozen=True)
class AttentionMetadata:
    """Batch layout shared by every attention backend (made by :func:`build_attention_metadata`)."""

    slot_mapping: torch.Tensor      # [num_tokens] int64
    block_tables: torch.Tensor      # [num_seqs, max_blocks_per_seq] int64
    seq_lens: list[int]             # per sequence: context length including new tokens
    query_lens: list[int]           # per sequence: new tokens this step
    num_decodes: int                # the first num_decodes sequences have query_len == 1
    block_size: int


def build_attention_metadata(block_tables: Sequence[Sequence[int]], seq_lens: list[int], query_lens: list[int],
                             block_size: int, device: torch.device) -> AttentionMetadata:
    """The one way a batch's metadata is made. Sequence ``i`` feeds positions
    ``[seq_lens[i] - query_lens[i], seq_lens[i])`` into the slots its block table gives them;
    each table must cover its sequence. Callers put single-token rows first: the leading run
    of them is the decode section (a later single-token row is just a short prefill chunk)."""
    bs = block_size
    slots = [table[p // bs] * bs + p % bs for table, end, n in zip(block_tables, seq_lens, query_lens)
             for p in range(end - n, end)]
    used = [list(table[:-(-end // bs)]) for table, end in zip(block_tables, seq_lens)]
    width = max(map(len, used))
    tables = torch.tensor([t + [0] * (width - len(t)) for t in used], dtype=torch.long)
    num_decodes = next((i for i, n in enumerate(query_lens) if n != 1), len(query_lens))
    return AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=device), tables.to(device),
                             list(seq_lens), list(query_lens), num_decodes, bs)


@dataclass(frozen=True)
class _DecodeBucket:
    start: int                      # first decode row
    end: int
    block_ids: torch.Tensor         # [num_rows * blocks] int64
    num_blocks: int                 # blocks per row (padded)
    mask: torch.Tensor              # [num_rows, 1, 1, num_blocks * block_size] float (0 / -inf)
    past: torch.Tensor | None       # [num_rows, num_blocks * block_size, 1, 1] bool: slots past the context


@dataclass(frozen=True)
class _PrefillChunk:
    start: int
    end: int
    context_len: int
    block_ids: torch.Tensor | None  # [blocks] int64; None when the chunk is the whole context
    mask: torch.Tensor | None       # [query_len, context_len] float; None means plain causal


@dataclass(frozen=True)
class CpuAttentionPlan:
    meta: AttentionMetadata
    decode_lens: torch.Tensor | None = None     # [decode_rows] int64 for the C kernel; None without it
    prefill_chunks: torch.Tensor | None = None  # [num_chunks, 3] int64 for the C kernel; None without it
    decode_tables: torch.Tensor | None = None   # [decode_rows, max_blocks] int64: the decode rows' tables

    @property
    def decode_rows(self) -> int:
        """The leading token rows the C decode kernel attends: the decode section, or every
        row of a step of short chunks (:data:`ROW_CHUNK_ROWS`)."""
        return 0 if self.decode_lens is None else self.decode_lens.shape[0]

    @cached_property
    def decodes(self) -> list[_DecodeBucket]:
        """Length buckets for the SDPA decode path (built only when a layer takes it)."""
        return _decode_buckets(self.meta)

    @cached_property
    def prefills(self) -> list[_PrefillChunk]:
        """Gather indices and masks for the SDPA prefill path (built only when a layer takes it)."""
        return _prefill_chunks(self.meta)


def plan_cpu_attention(meta: AttentionMetadata) -> CpuAttentionPlan:
    """The plan of the torch path: SDPA over length buckets and per chunk, shared by all layers."""
    return CpuAttentionPlan(meta)


# A step whose chunks are all this short (speculative verification: a request's last token and
# its drafts) is planned as decode rows, one per token: row j of a chunk of q tokens over a
# context of L attends to its first L - q + 1 + j keys, which is causal attention, through the
# decode kernel. So such a step runs on the fused decode layers (kernels/cpu/decode_layers.c)
# rather than op by op. A row re-reads its chunk's context after the row before it, from L2
# or L3; the multiply-adds are those of the prefill kernel.
ROW_CHUNK_ROWS = 16


def plan_native_attention(meta: AttentionMetadata) -> CpuAttentionPlan:
    """The plan of the ``cpu`` ops backend: decode rows and prefill chunks for the C kernels."""
    if meta.block_tables.device.type != "cpu" or loaded_kernels() is None:
        return plan_cpu_attention(meta)
    nd = meta.num_decodes
    if nd < len(meta.query_lens) and max(meta.query_lens[nd:]) <= ROW_CHUNK_ROWS:
        return _rows_plan(meta)
    decode_lens = torch.tensor(meta.seq_lens[:nd], dtype=torch.int64) if nd else None
    q_lens = meta.query_lens[nd:]   # prefill chunks follow the decode rows, one row per new token
    rows = list(zip(itertools.accumulate(q_lens, initial=nd), q_lens, meta.seq_lens[nd:]))
    chunks = torch.tensor(rows, dtype=torch.int64) if rows else None
    tables = meta.block_tables if nd == len(meta.seq_lens) else meta.block_tables[:nd]
    return CpuAttentionPlan(meta, decode_lens, chunks, tables if nd else None)


def _rows_plan(meta: AttentionMetadata) -> CpuAttentionPlan:
    """Every token row a decode row (ROW_CHUNK_ROWS): its own length, its sequence's table."""
    lens = [end - q + 1 + j for end, q in zip(meta.seq_lens, meta.query_lens) for j in range(q)]
    per_seq = torch.tensor(meta.query_lens, dtype=torch.int64)
    tables = meta.block_tables.repeat_interleave(per_seq, dim=0)
    return CpuAttentionPlan(meta, torch.tensor(lens, dtype=torch.int64), None, tables)


def _prefill_chunks(meta: AttentionMetadata) -> list[_PrefillChunk]:
    bs = meta.block_size
    prefills: list[_PrefillChunk] = []
    row = meta.num_decodes
    for s in range(meta.num_decodes, len(meta.seq_lens)):
        q_len, ctx = meta.query_lens[s], meta.seq_lens[s]
        if q_len == ctx:
            prefills.append(_PrefillChunk(row, row + q_len, ctx, None, None))
        else:
            keep = torch.ones(q_len, ctx, dtype=torch.bool).tril(ctx - q_len)
            mask = torch.zeros(q_len, ctx).masked_fill_(~keep, float("-inf"))
            prefills.append(_PrefillChunk(row, row + q_len, ctx,
                                          meta.block_tables[s, :_blocks_for(ctx, bs)], mask))
        row += q_len
    return prefills


def _decode_buckets(meta: AttentionMetadata) -> list[_DecodeBucket]:
    bs = meta.block_size
    decodes: list[_DecodeBucket] = []
    i = 0
    while i < meta.num_decodes:
        first_blocks = _blocks_for(meta.seq_lens[i], bs)
        j = i + 1
        while j < meta.num_decodes and _blocks_for(meta.seq_lens[j], bs) <= max(
                first_blocks * BUCKET_GROWTH, first_blocks + 1):
            j += 1
        num_blocks = _blocks_for(meta.seq_lens[j - 1], bs)
        lens = torch.tensor(meta.seq_lens[i:j])
        keep = torch.arange(num_blocks * bs)[None, :] < lens[:, None]
        mask = torch.zeros(keep.shape).masked_fill_(~keep, float("-inf"))
        past = None if keep.all() else ~keep.view(j - i, -1, 1, 1)
        decodes.append(_DecodeBucket(i, j, meta.block_tables[i:j, :num_blocks].reshape(-1),
                                     num_blocks, mask.view(j - i, 1, 1, -1), past))
        i = j
    return decodes


def cpu_paged_attention(
    q: torch.Tensor,        # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,        # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,        # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    plan: CpuAttentionPlan,
    scale: float,
) -> torch.Tensor:          # [num_tokens, num_heads, head_dim]
    """Store the new K/V by slot, then attend every query row over its context."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, plan.meta.slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, plan.meta.slot_mapping, v)
    out = torch.empty_like(q)
    if _decode_rows(q, k_cache, v_cache, plan, scale, out) < q.shape[0]:   # a pure decode step has no prefill rows
        _prefill_rows(q, k, v, k_cache, v_cache, plan, scale, out)
    return out


def _prefill_rows(q, k, v, k_cache, v_cache, plan: CpuAttentionPlan, scale: float, out: torch.Tensor) -> None:
    """The C kernel where the plan was made for it and it takes these tensors, else one SDPA
    call per chunk: over its own new K/V when it has no cached prefix, else over its
    gathered context."""
    if plan.prefill_chunks is not None:
        try:
            loaded_kernels().paged_prefill(q, k_cache, v_cache, plan.meta.block_tables[plan.meta.num_decodes:],
                                           plan.prefill_chunks, scale, out)
            return
        except ValueError:
            pass
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    for p in plan.prefills:
        qq = q[p.start:p.end].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, head_dim]
        if p.block_ids is None:
            kk = k[p.start:p.end].transpose(0, 1).unsqueeze(0)
            vv = v[p.start:p.end].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale, enable_gqa=True)
        else:
            ctx = p.context_len
            kk = k_cache.index_select(0, p.block_ids).view(-1, num_kv_heads, head_dim)[:ctx]
            vv = v_cache.index_select(0, p.block_ids).view(-1, num_kv_heads, head_dim)[:ctx]
            o = F.scaled_dot_product_attention(qq, kk.transpose(0, 1).unsqueeze(0),
                                               vv.transpose(0, 1).unsqueeze(0),
                                               attn_mask=p.mask, scale=scale, enable_gqa=True)
        out[p.start:p.end] = o.squeeze(0).transpose(0, 1)


def _decode_rows(q, k_cache, v_cache, plan: CpuAttentionPlan, scale: float, out: torch.Tensor) -> int:
    """The C kernel where the plan was made for it and it takes these tensors (its wrapper
    refuses other dtypes and layouts with ValueError), else gather + SDPA over the decode
    section. Returns the leading rows it attended (the rest are prefill rows)."""
    rows = plan.decode_rows
    if rows:
        try:
            loaded_kernels().paged_decode(q[:rows], k_cache, v_cache, plan.decode_tables, plan.decode_lens, scale,
                                          out[:rows])
            return rows
        except ValueError:
            pass
    _bucketed_decode(q, k_cache, v_cache, plan, scale, out)
    return plan.meta.num_decodes


def _bucketed_decode(q, k_cache, v_cache, plan: CpuAttentionPlan, scale: float, out: torch.Tensor) -> None:
    """Decode rows by gathering each length bucket's K/V and one SDPA call per bucket."""
    num_kv_heads, head_dim, bs = k_cache.shape[2], k_cache.shape[3], plan.meta.block_size
    for b in plan.decodes:
        rows = b.end - b.start
        shape = (rows, b.num_blocks * bs, num_kv_heads, head_dim)
        kk = k_cache.index_select(0, b.block_ids).view(shape)
        vv = v_cache.index_select(0, b.block_ids).view(shape)
        if b.past is not None:  # other requests' slots: a NaN there would get through the mask
            kk.masked_fill_(b.past, 0.0)
            vv.masked_fill_(b.past, 0.0)
        kk, vv = kk.transpose(1, 2), vv.transpose(1, 2)
        qq = q[b.start:b.end].unsqueeze(2)  # [rows, heads, 1, head_dim]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=b.mask, scale=scale, enable_gqa=True)
        out[b.start:b.end] = o.squeeze(2)


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)
