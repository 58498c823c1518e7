"""Kernel microbenchmarks: paged decode / prefill attention against torch SDPA on
contiguous K/V, and the weight-only INT8/INT4 matmuls against a plain torch matmul.

Every row also records the largest difference from the torch baseline at that shape, a
cheap correctness check at sizes the interpreter tests cannot reach.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench_utils import release, time_seconds
from kernels import (
    int4_matmul, int8_matmul, paged_decode_attention, paged_prefill_attention, quantize_int4, quantize_int8,
)


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype


def _paged_kv(shape: AttentionShape, num_seqs: int, context_len: int, device: torch.device):
    """A random cache holding num_seqs contexts in shuffled blocks, and the same K/V
    gathered contiguously ([num_seqs, num_kv_heads, context_len, head_dim]) for SDPA."""
    per_seq = math.ceil(context_len / shape.block_size)
    cache_shape = (num_seqs * per_seq, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, dtype=shape.dtype, device=device)
    v_cache = torch.randn(cache_shape, dtype=shape.dtype, device=device)
    block_tables = torch.randperm(num_seqs * per_seq, device=device).view(num_seqs, per_seq).to(torch.int32)
    seq_lens = torch.full((num_seqs,), context_len, dtype=torch.int32, device=device)

    def contiguous(cache: torch.Tensor) -> torch.Tensor:
        rows = cache[block_tables.long()].view(num_seqs, -1, shape.num_kv_heads, shape.head_dim)
        return rows[:, :context_len].transpose(1, 2).contiguous()

    return k_cache, v_cache, block_tables, seq_lens, contiguous(k_cache), contiguous(v_cache)


def bench_decode(shape: AttentionShape, num_seqs: int, context_len: int, device: torch.device) -> dict:
    k_cache, v_cache, block_tables, seq_lens, k, v = _paged_kv(shape, num_seqs, context_len, device)
    q = torch.randn(num_seqs, shape.num_heads, shape.head_dim, dtype=shape.dtype, device=device)
    scale = shape.head_dim ** -0.5
    ours = lambda: paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)  # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)  # noqa: E731
    diff = (ours().float() - sdpa()[:, :, 0].float()).abs().max().item()
    t_ours, t_sdpa = time_seconds(ours, device), time_seconds(sdpa, device)
    kv_bytes = 2 * k.numel() * k.element_size()
    row = {"kind": "decode", "batch": num_seqs, "context": context_len, "max_abs_diff_vs_sdpa": diff,
           "paged_us": t_ours * 1e6, "sdpa_us": t_sdpa * 1e6,
           "paged_GBps": kv_bytes / t_ours / 1e9, "sdpa_GBps": kv_bytes / t_sdpa / 1e9}
    k_cache = v_cache = k = v = None  # free device memory (the lambdas hold them too)
    release(device)
    return row


def bench_prefill(shape: AttentionShape, num_seqs: int, q_len: int, prefix_len: int, device: torch.device) -> dict:
    """num_seqs chunks of q_len tokens after prefix_len cached tokens each. SDPA runs only
    without a prefix: its is_causal mask is top-left aligned, the paged one bottom-right."""
    context_len = prefix_len + q_len
    k_cache, v_cache, block_tables, seq_lens, k, v = _paged_kv(shape, num_seqs, context_len, device)
    q = torch.randn(num_seqs * q_len, shape.num_heads, shape.head_dim, dtype=shape.dtype, device=device)
    cu = torch.arange(0, num_seqs + 1, dtype=torch.int32, device=device) * q_len
    scale = shape.head_dim ** -0.5
    ours = lambda: paged_prefill_attention(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, q_len)  # noqa: E731
    visible_pairs = num_seqs * (q_len * prefix_len + q_len * (q_len + 1) // 2)
    flops = 4 * shape.num_heads * shape.head_dim * visible_pairs
    t_ours = time_seconds(ours, device)
    row = {"kind": "prefill", "seqs": num_seqs, "q_len": q_len, "prefix": prefix_len,
           "paged_us": t_ours * 1e6, "paged_TFLOPs": flops / t_ours / 1e12}
    if prefix_len == 0:
        q4 = q.view(num_seqs, q_len, shape.num_heads, shape.head_dim).transpose(1, 2)
        def sdpa():
            return F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale, enable_gqa=True)
        expected = sdpa().transpose(1, 2).reshape(q.shape)
        t_sdpa = time_seconds(sdpa, device)
        row.update(sdpa_us=t_sdpa * 1e6, sdpa_TFLOPs=flops / t_sdpa / 1e12,
                   max_abs_diff_vs_sdpa=(ours().float() - expected.float()).abs().max().item())
    k_cache = v_cache = k = v = None
    release(device)
    return row


def bench_matmul(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> dict:
    """x [m, k] @ W.T with W [n, k] in dtype, INT8 and INT4 (group 128); GB/s of weights."""
    w = torch.randn(n, k, dtype=dtype, device=device) * 0.02
    x = torch.randn(m, k, dtype=dtype, device=device)
    qweight, scale = quantize_int8(w)
    packed, scales, mins = quantize_int4(w, 128)
    dense = F.linear(x, w).float()
    row = {"kind": "matmul", "m": m, "n": n, "k": k}
    cases = {"dense": (lambda: F.linear(x, w), w.numel() * w.element_size()),
             "int8": (lambda: int8_matmul(x, qweight, scale), qweight.numel() + scale.numel() * 4),
             "int4": (lambda: int4_matmul(x, packed, scales, mins, 128), packed.numel() + 8 * scales.numel())}
    for name, (fn, weight_bytes) in cases.items():
        seconds = time_seconds(fn, device)
        row[f"{name}_us"] = seconds * 1e6
        row[f"{name}_weight_GBps"] = weight_bytes / seconds / 1e9
        row[f"{name}_rel_err_vs_dense"] = ((fn().float() - dense).norm() / dense.norm()).item()
    w = qweight = packed = None
    release(device)
    return row
