"""``fleet bench throughput``: this engine vs transformers, side by side in one process.

(a) naive static batching: ``generate`` over padded batches of 8;
(b) transformers' own continuous batching;
(c) this engine;
all on the same weights and the same seeded mixed-length workload, greedy, fixed output
lengths. Also reports the machine's compute limit for the same work: the workload's model
FLOPs divided by an fp32 matmul peak measured in the same run.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from gpu_worker.bench.baselines import hf_continuous, load_hf_model, matmul_peak_gflops, naive_static
from gpu_worker.bench.pictures import machine, plot_throughput, throughput_title
from gpu_worker.bench.workload import STRUCTURED_SCHEMA, WorkItem, mixed_workload
from gpu_worker.model.ops import onednn
from gpu_worker.model.config import ModelConfig

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--plot", type=Path, default=None, help="PNG plot (default: beside --json)")
    p.add_argument("--skip-baselines", action="store_true", help="engine only (quick look)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--structured", action="store_true",
                   help="also run the engine with a JSON Schema on every request (engine_structured_tok_s)")
    p.add_argument("--structured-pairs", type=int, default=2,
                   help="--structured: unconstrained/constrained runs, alternated, this many of each")
    p.add_argument("--no-ablate-onednn", dest="ablate_onednn", action="store_false",
                   help="skip the second engine run with oneDNN packing off (engine_mkl_tok_s)")
    p.add_argument("--no-ablate-kernels", dest="ablate_kernels", action="store_false",
                   help="skip the engine run with the pure-torch ops instead of the C kernels "
                        "(engine_torch_ops_tok_s)")


def run(args: argparse.Namespace) -> int:
    items = mixed_workload(args.requests, args.seed)
    llm = _engine(args)
    result = {"requests": len(items), "seed": args.seed, "model": llm.engine.model_dir.name,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
              "prompt_tokens": sum(len(i.prompt_token_ids) for i in items),
              "output_tokens": sum(i.max_tokens for i in items), **machine()}
    peaks = matmul_peak_gflops()
    peak = peaks["peak"]
    flops = workload_flops(llm.engine.model_config, items)
    result.update(matmul_peak_gflops=peak, matmul_peaks_gflops=peaks, workload_gflop=flops / 1e9,
                  compute_limit_tok_s=result["output_tokens"] / (flops / 1e9 / peak))
    engine_s, engine_out = _run_engine(llm, items)
    result["engine_s"], result["engine_tok_s"] = engine_s, result["output_tokens"] / engine_s
    logger.info("engine: %.1f tok/s", result["engine_tok_s"])
    if args.structured:
        result.update(_structured_pairs(llm, items, args.structured_pairs))
    model_dir = llm.engine.model_dir
    result["engine_ops"] = llm.engine.model.ops.name
    del llm
    gc.collect()
    if args.ablate_kernels and result["engine_ops"] == "cpu":
        result["engine_torch_ops_tok_s"] = _engine_with_env(args, items, {"FLEET_OPS": "torch"})
        logger.info("engine with the pure-torch ops (FLEET_OPS=torch): %.1f tok/s", result["engine_torch_ops_tok_s"])
    if args.ablate_onednn and onednn.available():
        result["engine_mkl_tok_s"] = _engine_with_env(args, items, {"FLEET_ONEDNN": "0"})
        logger.info("engine with torch's own matmuls (FLEET_ONEDNN=0): %.1f tok/s", result["engine_mkl_tok_s"])
    if not args.skip_baselines:
        model = load_hf_model(model_dir)
        cb_s, cb_out = hf_continuous(model, items, max(i.max_tokens for i in items))
        result["hf_continuous_s"], result["hf_continuous_tok_s"] = cb_s, _useful(cb_out) / cb_s
        logger.info("transformers continuous batching: %.1f tok/s", result["hf_continuous_tok_s"])
        st_s, st_out = naive_static(model, items)
        result["naive_static_s"], result["naive_static_tok_s"] = st_s, _useful(st_out) / st_s
        logger.info("naive static batching: %.1f tok/s", result["naive_static_tok_s"])
        result["engine_vs_hf_continuous"] = result["engine_tok_s"] / result["hf_continuous_tok_s"]
        result["engine_vs_naive_static"] = result["engine_tok_s"] / result["naive_static_tok_s"]
        result["exact_vs_hf_continuous"] = _agreement(engine_out, cb_out)
        result["exact_vs_naive_static"] = _agreement(engine_out, st_out)
    result["engine_fraction_of_compute_limit"] = result["engine_tok_s"] / result["compute_limit_tok_s"]
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        _plot(result, args.plot or args.json.with_suffix(".png"))
    return 0


def _engine(args: argparse.Namespace):
    from gpu_worker.llm import LLM

    return LLM(args.model, kv_cache_memory=4 << 30, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens)


def _engine_with_env(args: argparse.Namespace, items: list[WorkItem], env: dict[str, str]) -> float:
    """The same engine built under ``env`` (an ablation: what one part of it is worth)."""
    from unittest import mock

    with mock.patch.dict(os.environ, env):
        llm = _engine(args)
    seconds, _ = _run_engine(llm, items)
    return sum(i.max_tokens for i in items) / seconds


def workload_flops(cfg: ModelConfig, items: list[WorkItem]) -> float:
    """Model FLOPs the workload needs at the least: every prompt token and every generated
    token but the last goes through the decoder once; every generated token needs logits."""
    h, d = cfg.hidden_size, cfg.head_dim
    linear = cfg.num_layers * (h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d + cfg.num_heads * d * h
                               + 3 * h * cfg.intermediate_size)
    total = 0.0
    for it in items:
        n_fed = len(it.prompt_token_ids) + it.max_tokens - 1
        # attention: QK^T and PV over the causal context of each fed token
        attn = 4 * cfg.num_layers * cfg.num_heads * d * (n_fed * (n_fed + 1) / 2)
        total += 2 * linear * n_fed + attn + 2 * cfg.vocab_size * h * it.max_tokens
    return total


def _structured_pairs(llm, items: list[WorkItem], pairs: int) -> dict:
    """Side by side on the same engine, alternated (so a change of load hits both): each
    pair an unconstrained run then one with a JSON Schema on every request."""
    tokens = sum(i.max_tokens for i in items)
    runs = [[tokens / _run_engine(llm, items, structured=s)[0] for s in (False, True)] for _ in range(pairs)]
    plain, constrained = sum(u for u, _ in runs) / pairs, sum(c for _, c in runs) / pairs
    logger.info("unconstrained %.1f tok/s, a JSON Schema on every request %.1f tok/s", plain, constrained)
    return {"structured_pairs_tok_s": runs, "engine_unconstrained_tok_s": plain,
            "engine_structured_tok_s": constrained, "structured_vs_unconstrained": constrained / plain}


def _run_engine(llm, items: list[WorkItem], structured: bool = False) -> tuple[float, list[list[int]]]:
    """Seconds for the workload, and its outputs. ``structured``: every request constrained
    by STRUCTURED_SCHEMA (compiled in the warm-up, as a worker's cache would hold it)."""
    from gpu_worker.sampling_params import SamplingParams
    from gpu_worker.structured import StructuredSpec

    spec = StructuredSpec.json_schema(STRUCTURED_SCHEMA) if structured else None
    params = [SamplingParams(temperature=0, max_tokens=i.max_tokens, ignore_eos=not structured, structured=spec)
              for i in items]
    llm.generate([items[0].prompt_token_ids[:8]], SamplingParams(temperature=0, max_tokens=2, structured=spec))
    t0 = time.perf_counter()
    outs = llm.generate([i.prompt_token_ids for i in items], params)
    seconds = time.perf_counter() - t0
    if any(len(o.token_ids) != i.max_tokens for o, i in zip(outs, items)):
        raise RuntimeError("an output ended before max_tokens: the comparison would not be like for like")
    return seconds, [o.token_ids for o in outs]


def _useful(outputs: list[list[int]]) -> int:
    return sum(len(o) for o in outputs)


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of requests whose greedy outputs are token-identical."""
    return sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def _plot(result: dict, path: Path) -> None:
    """One run's picture, titled with the CPU, date and load it ran under (bench/pictures.py)."""
    try:
        plot_throughput([result], cpu=result["cpu"], date=result["date"], path=path,
                        title=throughput_title(result), limit=result.get("compute_limit_tok_s"),
                        load=result["load_avg"])
    except ImportError:
        logger.warning("matplotlib not installed: no plot")
        return
    logger.info("plot written to %s (several runs of one machine: docs/bench/throughput-runs.json)", path)
