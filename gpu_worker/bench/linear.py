"""``fleet bench linear``: torch's ``F.linear`` against the oneDNN-packed weight the engine
uses on the CPU, on the model's own projection shapes, from 1 to 1024 rows.

Run it on a new kind of CPU before trusting the default: ``speedup`` above 1 everywhere
means packing pays there; ``FLEET_ONEDNN=0`` turns it off.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_worker.bench.timing import mean_seconds
from gpu_worker.model.ops import onednn

ROWS = (1, 2, 4, 8, 16, 32, 64, 256, 1024)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated batch rows")
    p.add_argument("--layers", type=int, default=8, help="distinct weights per shape (defeats the caches)")
    p.add_argument("--json", type=Path, default=None)


def projection_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each matmul of one decoder layer, and the LM head."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h), "o_proj": (h, cfg.num_heads * d),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size),
            "lm_head": (cfg.vocab_size, h)}


def measure(shapes: dict[str, tuple[int, int]], rows: list[int], layers: int) -> list[dict]:
    out = []
    for name, (n, k) in shapes.items():
        count = 1 if name == "lm_head" else layers
        weights = [torch.randn(n, k) * 0.02 for _ in range(count)]
        packed = [onednn.PackedLinear(w) for w in weights]
        for m in rows:
            x = torch.randn(m, k)
            dense = mean_seconds(lambda: [F.linear(x, w) for w in weights]) / count
            fast = mean_seconds(lambda: [p(x) for p in packed]) / count
            out.append({"shape": name, "rows": m, "out": n, "in": k, "torch_us": dense * 1e6,
                        "onednn_us": fast * 1e6, "speedup": dense / fast,
                        "onednn_gflops": 2 * m * n * k / fast / 1e9,
                        "onednn_weight_GBps": 4 * n * k / fast / 1e9})
    return out


def run(args: argparse.Namespace) -> int:
    from gpu_worker.model.loader import load_model_config, resolve_model_dir

    if not onednn.available():
        print("oneDNN packing is not available in this torch build (or FLEET_ONEDNN=0)")
        return 1
    cfg = load_model_config(resolve_model_dir(args.model))
    rows = [int(r) for r in args.rows.split(",")]
    results = measure(projection_shapes(cfg), rows, args.layers)
    print(f"{'shape':8} {'rows':>5} {'torch us':>9} {'oneDNN us':>9} {'speedup':>7} {'GFLOP/s':>8}")
    for r in results:
        print(f"{r['shape']:8} {r['rows']:5d} {r['torch_us']:9.1f} {r['onednn_us']:9.1f} "
              f"{r['speedup']:7.2f} {r['onednn_gflops']:8.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                                         "results": results}, indent=2))
    return 0
