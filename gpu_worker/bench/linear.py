"""``fleet bench linear``: the CPU matmuls on the model's own projection shapes, side by side
in one process: torch's ``F.linear``, the oneDNN-packed weight the engine uses for fp32
(``PackedLinear``), and the C kernels of ``kernels/cpu/linear.c`` over packed f32, bf16,
int8 (per channel and per group) and int4 weights (``int4g32p``: in k pairs, not quads), and W8A8 (activations quantized on the fly, one
scale a row or per 64 / 32 input features).

Each weight is replicated until the copies of one format fill ``--mib`` MiB (more than the
L3 cache), and the calls cycle over them, so that few-row figures are memory-bound as in a
real decode step. ``GB/s`` counts the bytes of the weight in its own format (codes and
scales); ``GFLOP/s`` counts 2 M N K. Run it on a new kind of CPU before trusting the
defaults: oneDNN ``speedup`` over torch above 1 means packing pays (``FLEET_ONEDNN=0`` turns
it off), and ``vs_onednn`` above 1 means a packed format beats oneDNN fp32 at that size.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_worker.bench.timing import mean_seconds
from gpu_worker.model.ops import onednn
from kernels.cpu import linear as packed_linear
from kernels.quantize import quantize_int4, quantize_int8

ROWS = (1, 2, 4, 8, 16, 64, 256)
# name -> packer of a [N, K] float32 weight; int8 per channel and per group of 64, int4 per 32.
FORMATS = {
    "f32": packed_linear.pack_f32,
    "bf16": packed_linear.pack_bf16,
    "int8": lambda w: packed_linear.pack_int8(*quantize_int8(w)),
    "int8g64": lambda w: packed_linear.pack_int8(*quantize_int8(w, 64)),
    "int4g32": lambda w: packed_linear.pack_int4(*quantize_int4(w, 32), 32),
    "int4g32p": lambda w: packed_linear.pack_int4(*quantize_int4(w, 32), 32, quads=False),   # k pairs
    "w8a8": lambda w: packed_linear.pack_w8a8(*quantize_int8(w)),
    "w8a8a64": lambda w: packed_linear.pack_w8a8(*quantize_int8(w), 64),   # one x scale per 64 features
    "w8a8a32": lambda w: packed_linear.pack_w8a8(*quantize_int8(w), 32),
}
CALLS = {f: packed_linear.linear_w8a8 for f in FORMATS if f.startswith("w8a8")}   # the rest: packed_linear.linear


def _non_negative(text: str) -> int:
    """argparse type: an integer >= 0 (the C tunings read -1 as "this CPU's default": leave the flag out for that)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (leave it out for this CPU's default), got {value}")
    return value


def _runs_in_c(name: str) -> bool:
    """The C kernel (not the torch reference) serves format ``name`` here."""
    return packed_linear.supported("w8a8" if name.startswith("w8a8") else name.split("g")[0])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated batch rows")
    p.add_argument("--mib", type=int, default=128, help="MiB of copies per weight and format (defeats the caches)")
    p.add_argument("--formats", default=None, help=f"comma-separated, of {', '.join(FORMATS)} (default: all)")
    p.add_argument("--no-torch", action="store_true", help="skip torch's F.linear (slow at many rows)")
    p.add_argument("--one-row-prefetch", choices=("default", "on", "off"), default="default",
                   help="few-row calls' prefetch into L1 (kernels/cpu/linear.c; default: this CPU's)")
    p.add_argument("--codes-halves", choices=("default", "on", "off"), default="default",
                   help="AVX2: int8 at 4-8 rows and int4 at 4-5 decoded in registers by halves, not "
                        "into a buffer (kernels/cpu/linear.c; default: on in AVX2 builds)")
    p.add_argument("--quads-prefetch", type=_non_negative, default=None,
                   help="int4 quads' prefetch distance in bytes (0: off; default: this CPU's)")
    p.add_argument("--quads-split", type=_non_negative, default=None,
                   help="from how many rows int4 quads split nibbles into a buffer (0: never; default: this CPU's)")
    p.add_argument("--json", type=Path, default=None)


def projection_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each matmul of one decoder layer, and the LM head."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h), "o_proj": (h, cfg.num_heads * d),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size),
            "lm_head": (cfg.vocab_size, h)}


def _nbytes(w: packed_linear.PackedWeight) -> int:
    """Bytes a matmul reads of ``w`` (padding channels included)."""
    return sum(t.numel() * t.element_size() for t in (w.data, w.scales, w.mins) if t is not None)


def _copies(make, nbytes: int, mib: int) -> list:
    """Enough independent results of ``make()`` to fill ``mib`` MiB (at least one)."""
    return [make() for _ in range(max(1, -(-mib * 2**20 // nbytes)))]


def _clone(w: packed_linear.PackedWeight) -> packed_linear.PackedWeight:
    """A copy of ``w`` in memory of its own."""
    return dataclasses.replace(w, data=w.data.clone(), scales=None if w.scales is None else w.scales.clone(),
                               mins=None if w.mins is None else w.mins.clone())


def _time(fn, weights: list, x: torch.Tensor) -> float:
    """Seconds per call of ``fn(x, w)``, cycling over ``weights``."""
    return mean_seconds(lambda: [fn(x, w) for w in weights]) / len(weights)


def measure_shape(name: str, n: int, k: int, rows: list[int], formats: list[str], mib: int,
                  with_torch: bool) -> list[dict]:
    """One row of results per (rows, implementation) for the [n, k] weight ``name``."""
    w = torch.randn(n, k) * 0.02
    impls = {"onednn": (lambda x, p: p(x), _copies(lambda: onednn.PackedLinear(w), 4 * n * k, mib), 4 * n * k)}
    if with_torch:
        impls["torch"] = (F.linear, _copies(lambda: w.clone(), 4 * n * k, mib), 4 * n * k)
    for fmt in formats:
        p = FORMATS[fmt](w)
        impls[fmt] = (CALLS.get(fmt, packed_linear.linear), _copies(lambda: _clone(p), _nbytes(p), mib), _nbytes(p))
    out = []
    for m in rows:
        x = torch.randn(m, k)
        base = None
        for impl, (fn, weights, nbytes) in impls.items():
            sec = _time(fn, weights, x)
            base = sec if impl == "onednn" else base
            out.append({"shape": name, "rows": m, "out": n, "in": k, "impl": impl, "us": sec * 1e6,
                        "GBps": nbytes / sec / 1e9, "GFLOPs": 2 * m * n * k / sec / 1e9, "vs_onednn": base / sec})
    return out


def run(args: argparse.Namespace) -> int:
    from gpu_worker.model.loader import load_model_config, resolve_model_dir

    if not onednn.available():
        print("oneDNN packing is not available in this torch build (or FLEET_ONEDNN=0)")
        return 1
    formats = [f for f in (args.formats or ",".join(FORMATS)).split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        print(f"unknown formats {unknown}; known: {', '.join(FORMATS)}")
        return 2
    slow = [f for f in formats if not _runs_in_c(f)]
    if slow:
        print(f"note: no C kernel on this CPU for {slow}: timing the pure-torch reference")
    if args.one_row_prefetch != "default":
        packed_linear.tuning(one_row_prefetch=args.one_row_prefetch == "on")
    if args.codes_halves != "default":
        packed_linear.tuning(codes_halves=args.codes_halves == "on")
    if args.quads_prefetch is not None:
        packed_linear.quads_prefetch(args.quads_prefetch)
    if args.quads_split is not None:
        packed_linear.quads_split(args.quads_split)
    cfg = load_model_config(resolve_model_dir(args.model))
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    print(f"{'shape':8} {'rows':>5} {'impl':8} {'us':>9} {'GB/s':>7} {'GFLOP/s':>8} {'vs oneDNN':>9}")
    for name, (n, k) in projection_shapes(cfg).items():
        for r in measure_shape(name, n, k, rows, formats, args.mib, not args.no_torch):
            print(f"{r['shape']:8} {r['rows']:5d} {r['impl']:8} {r['us']:9.1f} {r['GBps']:7.1f} "
                  f"{r['GFLOPs']:8.1f} {r['vs_onednn']:9.2f}")
            results.append(r)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__,
                                         "results": results}, indent=2))
    return 0
