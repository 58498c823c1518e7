"""``fleet bench cpu-attention``: the C attention kernels of the ``cpu`` backend against the
torch path (gather + SDPA per length bucket for decode rows, one SDPA call per prefill
chunk), one step over every layer of a model's shape, on the CPU.

Both run the same ``cpu_paged_attention`` (K/V stored by slot first); only the plan
differs. Caches are per layer and blocks are scattered, as after churn, so the K/V reads are
cold the way they are in a served decode step.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from gpu_worker.bench.timing import mean_seconds
from gpu_worker.bench.workload import mixed_workload
from gpu_worker.model.attention import AttentionMetadata, cpu_paged_attention, plan_cpu_attention, plan_native_attention
from gpu_worker.model.ops.cpu_native import loaded_kernels


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--heads", type=int, default=9, help="query heads (default: SmolLM2-135M's)")
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--json", type=Path, default=None)


def step_metadata(seq_lens: list[int], query_lens: list[int], bs: int, seed: int):
    """Metadata for one step (decode rows first), its block ids scattered over a cache that
    holds them all with room to spare."""
    rng = random.Random(seed)
    blocks = [-(-n // bs) for n in seq_lens]
    order = list(range(sum(blocks) * 2))
    rng.shuffle(order)
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int64)
    used, slots = 0, []
    for i, (n, q) in enumerate(zip(seq_lens, query_lens)):
        tables[i, :blocks[i]] = torch.tensor(order[used:used + blocks[i]])
        used += blocks[i]
        slots += [int(tables[i, p // bs]) * bs + p % bs for p in range(n - q, n)]
    num_decodes = sum(1 for q in query_lens if q == 1)
    return AttentionMetadata(torch.tensor(slots), tables, seq_lens, query_lens, num_decodes, bs), len(order)


def measure(case: str, seq_lens: list[int], query_lens: list[int], args: argparse.Namespace) -> dict:
    meta, num_blocks = step_metadata(seq_lens, query_lens, args.block_size, seed=0)
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    caches = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in range(args.layers)]
    tokens = sum(query_lens)
    qkv = torch.randn(tokens, args.heads + 2 * args.kv_heads, args.head_dim, generator=gen)
    q, k, v = qkv.split([args.heads, args.kv_heads, args.kv_heads], dim=1)
    scale = args.head_dim ** -0.5

    def run(plan_fn):
        plan = plan_fn(meta)    # planned once per step, as the model runner does
        return [cpu_paged_attention(q, k, v, kc, vc, plan, scale) for kc, vc in caches]

    torch_s = mean_seconds(lambda: run(plan_cpu_attention), reps=3)
    kernel_s = mean_seconds(lambda: run(plan_native_attention), reps=3)
    diff = max((a - b).abs().max().item() for a, b in zip(run(plan_cpu_attention), run(plan_native_attention)))
    return {"case": case, "sequences": len(seq_lens), "tokens": tokens, "context_tokens": sum(seq_lens),
            "torch_ms": torch_s * 1e3, "kernel_ms": kernel_s * 1e3, "speedup": torch_s / kernel_s,
            "max_abs_diff": diff}


def run(args: argparse.Namespace) -> int:
    if loaded_kernels() is None:
        print("the C kernels did not build here (no compiler, or FLEET_CPU_KERNELS=0): nothing to compare")
        return 1
    rng = random.Random(0)
    decode_lens = sorted(rng.randint(40, 500) for _ in range(64))
    prompts = [len(i.prompt_token_ids) for i in mixed_workload(64, 0)]
    results = [
        measure("decode, 64 sequences of 40-500 tokens", decode_lens, [1] * 64, args),
        measure("decode, 8 sequences of 40-500 tokens", decode_lens[::8], [1] * 8, args),
        measure("prefill, the throughput benchmark's 64 prompts", prompts, prompts, args),
        measure("prefill, 512 tokens after a cached prefix of 3,584", [4096], [512], args),
    ]
    for r in results:
        print(f"{r['case']}: torch {r['torch_ms']:.1f} ms, kernel {r['kernel_ms']:.1f} ms "
              f"({r['speedup']:.2f}x), max |diff| {r['max_abs_diff']:.1e}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"layers": args.layers, "threads": torch.get_num_threads(),
                                         "results": results}, indent=2))
    return 0
