"""GPU check: kernel microbenchmarks, the engine end to end on CUDA (Triton ops, quantized
engines, CUDA-graph decode vs eager), the self-draft speed-up (INT4/INT8 vs bf16 decode of a
Llama-3-8B-shaped model) and Llama-3-8B-shaped decode throughput, as JSON.

    python ops/bench/gpu_check.py [--out DIR] [--dry-run] [--context N] [--skip-micro] [--skip-model]
                                  [--skip-engine] [--skip-self-draft]

Needs only torch and triton (no network, no model files). Results go to
DIR/gpu_check.json (DIR: --out, else $OUT, else ./gpu_check_out) and a summary to stdout.
--dry-run uses tiny shapes; without CUDA it runs the kernels under TRITON_INTERPRET=1 so the
whole script can be smoke-tested on a CPU (its timings then mean nothing).
"""

import argparse
import logging
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]  # sibling modules, then the repo's `kernels`

log = logging.getLogger("gpu_check")

LLAMA3_8B_ATTENTION = dict(num_heads=32, num_kv_heads=8, head_dim=128, block_size=16)
FULL = {
    "decode": [(b, c) for b in (1, 16, 64, 256) for c in (512, 1024, 4096)],
    "prefill": [(1, 2048, 0), (4, 1024, 0), (16, 512, 0), (1, 1024, 3072), (64, 1, 2047)],
    "matmul": [(m, n, k) for m in (1, 16, 64) for n, k in ((6144, 4096), (28672, 4096), (4096, 14336))],
    "batch_sizes": [1, 16, 64, 256],
    "copy_bytes": 4 << 30,
    "self_draft_batch_sizes": [1, 16],
    "int4_group_size": 128,
    "engine": True,
}
TINY = {
    "attention": dict(num_heads=6, num_kv_heads=2, head_dim=16, block_size=16),
    "decode": [(1, 20), (3, 40)],
    "prefill": [(2, 9, 0), (1, 5, 12)],
    "matmul": [(1, 48, 128), (5, 32, 256)],
    "batch_sizes": [1, 3],
    "copy_bytes": 1 << 20,
    "model": dict(num_layers=2, hidden=64, num_heads=4, num_kv_heads=2, intermediate=96, vocab=128),
    "self_draft_batch_sizes": [1],
    "int4_group_size": 32,
    "engine": False,  # minutes under the interpreter; `python ops/bench/engine_check.py` runs it on a CPU
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"))
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes; CPU interpreter without CUDA")
    parser.add_argument("--context", type=int, default=None, help="decode-run context length (default 1024)")
    parser.add_argument("--skip-micro", action="store_true")
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-self-draft", action="store_true")
    return parser.parse_args(argv)


def guarded(label: str, fn, *args) -> dict | list:
    """Run one benchmark case; a failure (OOM, an unsupported SDPA path) becomes a row
    with the error instead of ending the unattended run."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded, and the run goes on
        log.exception("%s failed", label)
        return {"case": label, "error": f"{type(exc).__name__}: {exc}"[:500]}


def run_micro(plan: dict, shape_kwargs: dict, dtype, device) -> list[dict]:
    import kernel_bench

    shape = kernel_bench.AttentionShape(dtype=dtype, **shape_kwargs)
    rows = [guarded(f"decode {b}x{c}", kernel_bench.bench_decode, shape, b, c, device) for b, c in plan["decode"]]
    rows += [guarded(f"prefill {n}x{q}+{p}", kernel_bench.bench_prefill, shape, n, q, p, device)
             for n, q, p in plan["prefill"]]
    rows += [guarded(f"matmul {m}x{n}x{k}", kernel_bench.bench_matmul, m, n, k, dtype, device)
             for m, n, k in plan["matmul"]]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    if not torch.cuda.is_available():
        if not args.dry_run:
            log.error("no CUDA device: use --dry-run for the CPU smoke mode")
            return 2
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    import bench_utils
    import llama_decode_bench

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plan = TINY if args.dry_run else FULL
    started = time.perf_counter()
    result = {"environment": bench_utils.environment(device), "dry_run": args.dry_run, "dtype": str(dtype)}
    peak = bench_utils.peak_copy_bandwidth(device, plan["copy_bytes"])
    result["peak_copy_GBps"] = peak / 1e9
    log.info("device-to-device copy: %.0f GB/s", peak / 1e9)
    # Written after every phase, so a run cut short by its time limit still leaves figures.
    path = bench_utils.write_json(args.out, "gpu_check.json", result)
    if not args.skip_micro:
        result["micro"] = run_micro(plan, plan.get("attention", LLAMA3_8B_ATTENTION), dtype, device)
        log.info("microbenchmarks done at %.0f s", time.perf_counter() - started)
        bench_utils.write_json(args.out, "gpu_check.json", result)
    if plan["engine"] and not args.skip_engine:
        import engine_check

        result["engine"] = guarded("engine", engine_check.run, device, args.dry_run)
        log.info("engine check done at %.0f s", time.perf_counter() - started)
        bench_utils.write_json(args.out, "gpu_check.json", result)
    cfg = llama_decode_bench.LlamaShape(**plan.get("model", {}))
    context = args.context or (24 if args.dry_run else 1024)
    if not args.skip_self_draft:
        result["self_draft"] = guarded("self-draft", llama_decode_bench.run_self_draft, cfg,
                                       plan["self_draft_batch_sizes"], context, dtype, device, peak,
                                       ("int4", "int8"), plan["int4_group_size"])
        log.info("self-draft speed-up done at %.0f s", time.perf_counter() - started)
        bench_utils.write_json(args.out, "gpu_check.json", result)
    if not args.skip_model:
        result["model"] = {**vars(cfg), "head_dim": cfg.head_dim}
        result["decode"] = guarded("decode model", llama_decode_bench.run, cfg, plan["batch_sizes"], context,
                                   dtype, device, peak)
    result["wall_s"] = time.perf_counter() - started
    bench_utils.write_json(args.out, "gpu_check.json", result)
    summarize(result)
    log.info("wrote %s in %.0f s", path, result["wall_s"])
    return 0


def summarize(result: dict) -> None:
    """A few human-readable lines; the JSON holds everything."""
    print(f"peak copy bandwidth: {result['peak_copy_GBps']:.0f} GB/s")
    if "engine" in result:
        print("engine:", result["engine"])
    draft = result.get("self_draft", {})
    for key in ("int4_speedup_vs_dense", "int8_speedup_vs_dense"):
        if key in draft:
            print(f"self-draft {key} at batch {[r['batch'] for r in draft['dense']]}: "
                  + ", ".join(f"{x:.2f}x" for x in draft[key]))
    for row in result.get("micro", []):
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    decode = result.get("decode", [])
    for row in decode if isinstance(decode, list) else [decode]:
        if "error" in row:
            print(f"decode batch {row.get('batch', '?')}: {row['error']}")
            continue
        mode = "graph" if "graph_step_ms" in row else "eager"
        print(f"decode batch {row['batch']:>3} ctx {row['context']}: {row[f'{mode}_tokens_per_s']:.0f} tok/s "
              f"({mode}), {row[f'{mode}_GBps']:.0f} GB/s = {row[f'{mode}_frac_of_peak']:.0%} of peak, "
              f"logits finite: {row['logits_finite']}")


if __name__ == "__main__":
    sys.exit(main())
