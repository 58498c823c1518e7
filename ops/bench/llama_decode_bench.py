"""Decode throughput of a Llama-shaped model with random weights: the project's kernels for
norms, RoPE, KV store, paged attention and SiLU-mul, torch matmuls for the linears.

Every sequence sits at the same context length and each timed step decodes one token per
sequence (the step is replayed at that length: its cost does not depend on the values).
Achieved bandwidth = (weight bytes + KV bytes read) per step / step time.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench_utils import release, time_cuda_graph, time_seconds
from kernels import (
    fused_add_rmsnorm, int4_matmul, int8_matmul, quantize_int4, quantize_int8, paged_decode_attention, rotary_embedding, silu_and_mul, store_kvcache,
)
from kernels.reference import rope_cos_sin_cache


@dataclass(frozen=True)
class LlamaShape:
    num_layers: int = 32
    hidden: int = 4096
    num_heads: int = 32
    num_kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    block_size: int = 16
    rope_theta: float = 500000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads


def random_weights(cfg: LlamaShape, dtype: torch.dtype, device: torch.device, max_positions: int) -> dict:
    """Weights with a 1/sqrt(fan_in) scale so activations stay O(1) through the layers."""
    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, dtype=dtype, device=device) / math.sqrt(in_features)

    qkv_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    ones = torch.ones(cfg.hidden, dtype=dtype, device=device)
    layers = [{"qkv": linear(qkv_out, cfg.hidden), "o": linear(cfg.hidden, cfg.hidden),
               "gate_up": linear(2 * cfg.intermediate, cfg.hidden), "down": linear(cfg.hidden, cfg.intermediate),
               "input_norm": ones, "post_norm": ones} for _ in range(cfg.num_layers)]
    return {"embed": torch.randn(cfg.vocab, cfg.hidden, dtype=dtype, device=device), "layers": layers,
            "final_norm": ones, "lm_head": linear(cfg.vocab, cfg.hidden),
            "cos_sin": rope_cos_sin_cache(max_positions, cfg.head_dim, cfg.rope_theta).to(device)}


def linear(x: torch.Tensor, weight) -> torch.Tensor:
    """x @ W.T for a dense weight, or a quantized one: ("int8", q, scale) / ("int4", packed,
    scales, mins, group_size) from `quantize_linears`."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight)
    if weight[0] == "int8":
        return int8_matmul(x, *weight[1:])
    return int4_matmul(x, *weight[1:])


def quantize_linears(w: dict, method: str, group_size: int = 128) -> dict:
    """The same model with every layer linear weight-only quantized (LM head kept dense,
    as gpu_worker.model.quant does)."""
    def quantize(t: torch.Tensor):
        return ("int8", *quantize_int8(t)) if method == "int8" else ("int4", *quantize_int4(t, group_size), group_size)

    layers = [{k: (t if "norm" in k else quantize(t)) for k, t in layer.items()} for layer in w["layers"]]
    return {**w, "layers": layers}


def _nbytes(weight) -> int:
    tensors = [weight] if isinstance(weight, torch.Tensor) else [t for t in weight if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def decode_step(cfg: LlamaShape, w: dict, caches: list, batch: dict) -> torch.Tensor:
    """One token per sequence through the whole model; returns logits [num_seqs, vocab]."""
    heads, kv_heads, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    num_seqs = batch["tokens"].shape[0]
    h, residual = w["embed"][batch["tokens"]], None
    for layer, (k_cache, v_cache) in zip(w["layers"], caches):
        x, residual = fused_add_rmsnorm(h, residual, layer["input_norm"], cfg.eps)
        qkv = linear(x, layer["qkv"])
        q = qkv[:, :heads * dim].view(num_seqs, heads, dim)
        k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(num_seqs, kv_heads, dim)
        v = qkv[:, (heads + kv_heads) * dim:].view(num_seqs, kv_heads, dim)
        q, k = rotary_embedding(q, k, batch["positions"], w["cos_sin"])
        store_kvcache(k, v, k_cache, v_cache, batch["slot_mapping"])
        attn = paged_decode_attention(q, k_cache, v_cache, batch["block_tables"], batch["seq_lens"], dim ** -0.5)
        h = linear(attn.view(num_seqs, heads * dim), layer["o"])
        x, residual = fused_add_rmsnorm(h, residual, layer["post_norm"], cfg.eps)
        h = linear(silu_and_mul(linear(x, layer["gate_up"])), layer["down"])
    x, _ = fused_add_rmsnorm(h, residual, w["final_norm"], cfg.eps)
    return F.linear(x, w["lm_head"])


def make_caches(cfg: LlamaShape, num_blocks: int, dtype: torch.dtype, device: torch.device) -> list:
    shape = (num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = []
    for _ in range(cfg.num_layers):
        caches.append(tuple(torch.empty(shape, dtype=dtype, device=device).normal_() for _ in range(2)))
    return caches


def make_batch(cfg: LlamaShape, num_seqs: int, context_len: int, num_blocks: int, device: torch.device) -> dict:
    """Sequences at context_len (the new token included) in shuffled blocks of one pool."""
    per_seq = math.ceil(context_len / cfg.block_size)
    blocks = torch.randperm(num_blocks, device=device)[:num_seqs * per_seq].view(num_seqs, per_seq)
    last = context_len - 1
    slot_mapping = blocks[:, last // cfg.block_size].long() * cfg.block_size + last % cfg.block_size
    return {"tokens": torch.randint(0, cfg.vocab, (num_seqs,), device=device),
            "positions": torch.full((num_seqs,), last, dtype=torch.int64, device=device),
            "slot_mapping": slot_mapping, "block_tables": blocks.to(torch.int32),
            "seq_lens": torch.full((num_seqs,), context_len, dtype=torch.int32, device=device)}


def step_bytes(cfg: LlamaShape, w: dict, num_seqs: int, context_len: int, elem: int) -> int:
    """Bytes a step must read at least: every linear weight once, and each sequence's K/V."""
    linears = sum(_nbytes(t) for layer in w["layers"] for key, t in layer.items() if "norm" not in key)
    kv = 2 * cfg.num_layers * num_seqs * context_len * cfg.num_kv_heads * cfg.head_dim
    return linears + (w["lm_head"].numel() + kv) * elem


def measure(cfg: LlamaShape, w: dict, caches: list, batch: dict, dtype: torch.dtype,
            device: torch.device, peak_bytes_per_s: float) -> dict:
    num_seqs, context_len = batch["tokens"].shape[0], int(batch["seq_lens"][0])
    step = lambda: decode_step(cfg, w, caches, batch)  # noqa: E731
    finite = bool(torch.isfinite(step()).all())
    moved = step_bytes(cfg, w, num_seqs, context_len, torch.finfo(dtype).bits // 8)
    row = {"batch": num_seqs, "context": context_len, "logits_finite": finite, "bytes_per_step": moved}
    for mode, seconds in (("eager", time_seconds(step, device)), ("graph", time_cuda_graph(step, device))):
        if seconds is None:
            continue
        row[f"{mode}_step_ms"] = seconds * 1e3
        row[f"{mode}_tokens_per_s"] = num_seqs / seconds
        row[f"{mode}_GBps"] = moved / seconds / 1e9
        row[f"{mode}_frac_of_peak"] = moved / seconds / peak_bytes_per_s
    return row


def run(cfg: LlamaShape, batch_sizes: list[int], context_len: int, dtype: torch.dtype,
        device: torch.device, peak_bytes_per_s: float) -> list[dict]:
    """tokens/s and bandwidth per batch size, eager and (on CUDA) CUDA-graph replay."""
    w = random_weights(cfg, dtype, device, context_len)
    num_blocks = max(batch_sizes) * math.ceil(context_len / cfg.block_size)
    caches = make_caches(cfg, num_blocks, dtype, device)
    rows = []
    for num_seqs in batch_sizes:
        try:
            rows.append(measure(cfg, w, caches, make_batch(cfg, num_seqs, context_len, num_blocks, device),
                                dtype, device, peak_bytes_per_s))
        except Exception as exc:  # noqa: BLE001 - e.g. OOM at the largest batch: keep the others
            rows.append({"batch": num_seqs, "context": context_len, "error": f"{type(exc).__name__}: {exc}"[:500]})
            release(device)
    del w, caches
    release(device)
    return rows


def run_self_draft(cfg: LlamaShape, batch_sizes: list[int], context_len: int, dtype: torch.dtype,
                   device: torch.device, peak_bytes_per_s: float, methods=("int4", "int8"), group_size: int = 128) -> dict:
    """Decode tokens/s of the same random model dense vs weight-only quantized: the speed-up
    a quantized self-draft would have over its dense target (CUDA-graph replay when available)."""
    w = random_weights(cfg, dtype, device, context_len)
    num_blocks = max(batch_sizes) * math.ceil(context_len / cfg.block_size)
    caches = make_caches(cfg, num_blocks, dtype, device)
    batches = {b: make_batch(cfg, b, context_len, num_blocks, device) for b in batch_sizes}
    out = {"dense": [measure(cfg, w, caches, batches[b], dtype, device, peak_bytes_per_s) for b in batch_sizes]}
    for method in methods:
        qw = quantize_linears(w, method, group_size)
        out[method] = [measure(cfg, qw, caches, batches[b], dtype, device, peak_bytes_per_s) for b in batch_sizes]
        mode = "graph" if "graph_step_ms" in out[method][0] else "eager"
        out[f"{method}_speedup_vs_dense"] = [d[f"{mode}_step_ms"] / q[f"{mode}_step_ms"]
                                             for d, q in zip(out["dense"], out[method])]
        del qw
        release(device)
    del w, caches
    release(device)
    return out
