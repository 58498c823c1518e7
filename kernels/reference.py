"""Pure-torch references for every kernel: the ground truth the kernels are tested against.

They favour clarity over speed (per-sequence Python loops, float32 math) and never mutate
their arguments. Each returns what its kernel returns, in the input dtype.
"""

import torch

from kernels.quantize import dequantize_int4, dequantize_int8


def store_kvcache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, negative = skip the token
) -> tuple[torch.Tensor, torch.Tensor]:
    """Updated copies of (k_cache, v_cache)."""
    k_new, v_new = k_cache.clone(), v_cache.clone()
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_new.view(-1, *k_cache.shape[2:])[slots] = key[keep]
    v_new.view(-1, *v_cache.shape[2:])[slots] = value[keep]
    return k_new, v_new


def gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks_per_seq]
    context_len: int,
) -> torch.Tensor:  # [context_len, num_kv_heads, head_dim]
    """The first context_len cached tokens of one sequence, in position order."""
    block_size = cache.shape[1]
    num_blocks = -(-context_len // block_size)
    blocks = cache[block_table[:num_blocks].long()]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def paged_prefill_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the new tokens
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's query rows (its last q_len positions) over its
    whole cached context; rows outside every sequence stay zero."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for i, context_len in enumerate(lens):
        start, end = cu[i], cu[i + 1]
        q_len = end - start
        if q_len == 0 or context_len == 0:
            continue
        k = gather_context(k_cache, block_tables[i], context_len).float()
        v = gather_context(v_cache, block_tables[i], context_len).float()
        k = k.repeat_interleave(group, dim=1)  # [context_len, num_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale
        q_pos = torch.arange(context_len - q_len, context_len, device=q.device)
        visible = torch.arange(context_len, device=q.device)[None, :] <= q_pos[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v)
    return out.to(q.dtype)


def paged_decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32; 0 = empty slot, output zeros
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query token per sequence at its last position; zeros for an empty context."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, cu, seq_lens, scale)


def rmsnorm_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    residual: torch.Tensor | None,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed, new_residual: [num_tokens, hidden] each
    """HF Llama: the sum is rounded to the dtype, normalised in float32, rounded, times weight."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normed, x


def rotary_embedding_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, head_dim]: cos | sin halves
) -> tuple[torch.Tensor, torch.Tensor]:  # same shapes as q and k, contiguous
    """Neox/HF rotate_half rotary embedding computed in float32, rounded once."""
    cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


def rope_cos_sin_cache(max_positions: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """[max_positions, head_dim] float32 cache for plain (unscaled) RoPE."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * inter] -> [num_tokens, inter]
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def int8_matmul_ref(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [N, K] int8
    scale: torch.Tensor,  # [N] float32
) -> torch.Tensor:  # [M, N]
    w = dequantize_int8(qweight, scale)  # float32
    return (x.float() @ w.t()).to(x.dtype)


def int4_matmul_ref(
    x: torch.Tensor,  # [M, K]
    packed: torch.Tensor,  # [N, K // 2] uint8
    scales: torch.Tensor,  # [N, K // group_size] float32
    mins: torch.Tensor,  # [N, K // group_size] float32
    group_size: int,
) -> torch.Tensor:  # [M, N]
    w = dequantize_int4(packed, scales, mins, group_size)  # float32
    return (x.float() @ w.t()).to(x.dtype)
