"""Tile and split-K sweep of the weight-only INT8/INT4 Triton matmuls on a GPU.

    python ops/bench/quant_matmul_sweep.py [--out DIR] [--dry-run]

For the Llama-3-8B projection shapes at 1, 16 and 64 rows (bf16 activations): torch's bf16
matmul, each kernel with the launcher's own choice, and each over BLOCK_N x BLOCK_K x splits,
every result checked against the dequantized weights. Timed as CUDA-graph replays, as the
engine's decode steps run: timed eagerly, a few-microsecond kernel measures the Python
launcher (a split-K call launches three kernels), not the GPU. Writes DIR/quant_matmul_sweep.json
(DIR: --out, else $OUT, else ./gpu_check_out) and prints, per shape, the default and the best
configuration: what `kernels/quant_matmul.py`'s heuristic should pick.
--dry-run: tiny shapes and two configurations, under the Triton interpreter on a CPU.
"""

import argparse
import itertools
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336)]   # (N, K): qkv, gate/up, down
GRID = {"block_n": (32, 64), "block_k": (64, 128), "splits": (1, 2, 4, 8, 16)}
TINY = {"shapes": [(48, 256)], "rows": (1,), "grid": {"block_n": (32,), "block_k": (64,), "splits": (1, 2)}}


def _check(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def sweep(device, dry_run: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from bench_utils import release, time_cuda_graph, time_seconds

    def timed(fn, rep_ms: int = 100) -> float:
        fn()
        return time_cuda_graph(fn, device) or time_seconds(fn, device, rep_ms=rep_ms)
    from kernels import dequantize_int4, dequantize_int8, int4_matmul, int8_matmul, quantize_int4, quantize_int8

    dtype = torch.float32 if dry_run else torch.bfloat16
    shapes, rows, grid = (TINY["shapes"], TINY["rows"], TINY["grid"]) if dry_run else (SHAPES, (1, 16, 64), GRID)
    results = []
    for (n, k), m in itertools.product(shapes, rows):
        w = torch.randn(n, k, device=device) * 0.02
        x = torch.randn(m, k, device=device).to(dtype)
        qweight, scale = quantize_int8(w)
        packed, scales, mins = quantize_int4(w, 128)
        refs = {"int8": x.float() @ dequantize_int8(qweight, scale).t(),
                "int4": x.float() @ dequantize_int4(packed, scales, mins, 128).t()}
        calls = {"int8": lambda c: int8_matmul(x, qweight, scale, config=c),
                 "int4": lambda c: int4_matmul(x, packed, scales, mins, 128, config=c)}
        wd = w.to(dtype)
        row = {"m": m, "n": n, "k": k, "dense_us": 1e6 * timed(lambda: F.linear(x, wd))}
        for kind, call in calls.items():
            row[f"{kind}_default_us"] = 1e6 * timed(lambda: call(None))
            row[f"{kind}_default_err"] = _check(call(None), refs[kind])
            best = None
            for bn, bk, sp in itertools.product(grid["block_n"], grid["block_k"], grid["splits"]):
                if k // (sp * bk) < 1:
                    continue
                config = {"block_n": bn, "block_k": bk, "splits": sp}
                try:
                    err = _check(call(config), refs[kind])
                    us = 1e6 * timed(lambda: call(config), rep_ms=30)
                except Exception as exc:  # noqa: BLE001 - a config that fails to compile is a row
                    results.append({"m": m, "n": n, "k": k, "kind": kind, **config, "error": str(exc)[:300]})
                    continue
                results.append({"m": m, "n": n, "k": k, "kind": kind, **config, "us": us, "err": err})
                if err < 0.02 and (best is None or us < best[0]):
                    best = (us, config)
            row[f"{kind}_best_us"], row[f"{kind}_best"] = best if best else (None, None)
        results.append(row)
        print(f"m={m:3d} n={n:5d} k={k:5d} dense {row['dense_us']:7.1f} us | "
              + " | ".join(f"{kd} default {row[f'{kd}_default_us']:7.1f} best {row[f'{kd}_best_us'] or 0:7.1f} "
                           f"{row[f'{kd}_best']}" for kd in calls), flush=True)
        w = x = qweight = packed = None
        release(device)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        if not args.dry_run:
            print("no CUDA device: use --dry-run", file=sys.stderr)
            return 2
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from bench_utils import environment, write_json

    results = sweep(dev, args.dry_run)
    path = write_json(args.out, "quant_matmul_sweep.json", {"environment": environment(dev), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
