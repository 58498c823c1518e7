"""The ``triton`` backend of :class:`ModelOps`: the kernels of ``kernels/`` behind the model.

The attention metadata is turned into device tensors once per step (:func:`plan_triton_attention`)
and shared by every layer; each layer then stores its new K/V by slot, runs the split-KV
decode kernel over the decode rows (the runner puts them first) and the varlen prefill kernel
over the rest. Nothing here reads device data on the host, so a decode step built from a
:class:`TritonAttentionPlan` of static tensors can be captured in a CUDA graph.

On CPU tensors this runs only under ``TRITON_INTERPRET=1`` (tests); ``select_ops`` never picks
it there unless ``EngineConfig.ops_backend`` is ``triton``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

import kernels
from gpu_worker.model.ops.base import ModelOps, project_then


@dataclass(frozen=True)
class TritonAttentionPlan:
    """One step's batch layout as kernel arguments (decode rows first)."""

    slot_mapping: torch.Tensor          # [num_tokens] int64; negative = padding, not stored
    num_decodes: int                    # rows [0, num_decodes) are single-token decodes
    decode_block_tables: torch.Tensor   # [num_decodes, max_blocks] int32
    decode_seq_lens: torch.Tensor       # [num_decodes] int32 (0 = empty slot, output zeros)
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    prefill_cu_seqlens_q: torch.Tensor  # [num_prefills + 1] int32, relative to row num_decodes
    prefill_seq_lens: torch.Tensor      # [num_prefills] int32
    max_prefill_q_len: int              # host int: sizes the prefill grid without a sync


def plan_triton_attention(meta) -> TritonAttentionPlan:
    """AttentionMetadata -> kernel tensors, built once per step on the metadata's device."""
    dev = meta.slot_mapping.device
    nd = meta.num_decodes
    tables = meta.block_tables.to(torch.int32)
    seq_lens = torch.tensor(meta.seq_lens, dtype=torch.int32, device=dev)
    prefill_q = meta.query_lens[nd:]
    cu = list(itertools.accumulate(prefill_q, initial=0))
    return TritonAttentionPlan(
        slot_mapping=meta.slot_mapping,
        num_decodes=nd,
        decode_block_tables=tables[:nd],
        decode_seq_lens=seq_lens[:nd],
        prefill_block_tables=tables[nd:],
        prefill_cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
        prefill_seq_lens=seq_lens[nd:],
        max_prefill_q_len=max(prefill_q, default=0),
    )


def triton_attention(
    q: torch.Tensor,        # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,        # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,        # [num_tokens, num_kv_heads, head_dim], may be a view of the qkv output
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    plan: TritonAttentionPlan,
    scale: float,
) -> torch.Tensor:          # [num_tokens, num_heads, head_dim]
    kernels.store_kvcache(k, v, k_cache, v_cache, plan.slot_mapping)
    nd = plan.num_decodes
    parts = []
    if nd:
        parts.append(kernels.paged_decode_attention(q[:nd], k_cache, v_cache, plan.decode_block_tables,
                                                    plan.decode_seq_lens, scale))
    if q.shape[0] > nd:
        parts.append(kernels.paged_prefill_attention(
            q[nd:], k_cache, v_cache, plan.prefill_block_tables, plan.prefill_cu_seqlens_q,
            plan.prefill_seq_lens, scale, plan.max_prefill_q_len))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# cos_table -> kernel cache [max_pos, head_dim] (cos | sin halves); keyed weakly by identity so
# a model moved to another device (new buffers) gets a new cache and a freed model frees its own.
_COS_SIN_CACHES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cos_sin_cache(cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    cache = _COS_SIN_CACHES.get(cos_table)
    if cache is None:
        half = cos_table.shape[1] // 2  # the tables repeat each frequency in both halves
        cache = torch.cat((cos_table[:, :half], sin_table[:, :half]), dim=1).float().contiguous()
        _COS_SIN_CACHES[cos_table] = cache
    return cache


def _prepare_rope(positions, cos_table, sin_table):
    return positions, _cos_sin_cache(cos_table, sin_table)


def _rope(q, k, ctx):
    positions, cos_sin = ctx
    return kernels.rotary_embedding(q, k, positions, cos_sin)


TRITON_OPS = ModelOps("triton", kernels.fused_add_rmsnorm, _prepare_rope, _rope, kernels.silu_and_mul,
                      project_then(kernels.silu_and_mul),
                      plan_triton_attention, triton_attention)
