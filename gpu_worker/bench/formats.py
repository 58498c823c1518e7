"""``fleet bench formats``: decode speed of each weight format at several batch sizes, side by
side in one process on the same model.

For every format (fp32, bf16, the ``--quantization`` specs) and batch size B: B prompts of
``--prompt-tokens`` token ids, greedy, fixed output lengths. Decode tokens/s is
``B * decode_tokens / (t(1 + decode_tokens) - t(1))``: a run that also generates the
decode tokens minus a run that only prefills, so prefill and the first token fall out.
Formats are measured in rounds (every format once per round, alternating), and each figure
is the best of the rounds, the usual way to read a noisy 2-core machine. Each format's
greedy tokens at the largest batch are compared with fp32's (requests identical).
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import time
from pathlib import Path

from gpu_worker.bench.peers import cpu_info

logger = logging.getLogger(__name__)

DEFAULT_FORMATS = ("fp32", "bf16", "int8+head", "int4+head")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="comma list: fp32, bf16, or a --quantization spec (int8, int8-g64, int4, int8+head, ...)")
    p.add_argument("--batches", default="1,8,64", help="comma list of batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; each figure is the best round")
    p.add_argument("--model", default=None, help="model directory or .gguf (default: embedded SmolLM2)")
    p.add_argument("--json", type=Path, default=None)


def engine_options(fmt: str) -> dict:
    """EngineConfig fields for a format name."""
    if fmt == "fp32":
        return {}
    if fmt == "bf16":
        return {"dtype": "bfloat16"}
    return {"quantization": fmt}


def _prompts(batch: int, length: int) -> list[list[int]]:
    # Distinct token ids per prompt (no prefix sharing between them), away from special tokens.
    return [[1000 + (i * 7919 + j * 31) % 40000 for j in range(length)] for i in range(batch)]


def _timed_generate(llm, prompts, tokens: int):
    from gpu_worker import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.token_ids for o in outs]


def measure(llm, batch: int, prompt_tokens: int, decode_tokens: int) -> tuple[float, list[list[int]]]:
    """(decode tokens/s, greedy token ids) of one batch size on a loaded engine."""
    prompts = _prompts(batch, prompt_tokens)
    _timed_generate(llm, prompts[:1], 4)                       # warm-up
    t_prefill, _ = _timed_generate(llm, prompts, 1)
    t_all, tokens = _timed_generate(llm, prompts, 1 + decode_tokens)
    return batch * decode_tokens / max(t_all - t_prefill, 1e-9), tokens


def run_round(fmt: str, args, batches: list[int]) -> dict:
    from gpu_worker import LLM

    start = time.perf_counter()
    llm = LLM(args.model, kv_cache_memory=768 << 20, **engine_options(fmt))
    row = {"load_s": round(time.perf_counter() - start, 1), "tok_s": {}, "tokens": None}
    for b in batches:
        tok_s, tokens = measure(llm, b, args.prompt_tokens, args.decode_tokens)
        row["tok_s"][b] = round(tok_s, 1)
        row["tokens"] = tokens
        logger.info("%s batch %d: %.1f decode tokens/s", fmt, b, tok_s)
    del llm
    gc.collect()
    return row


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    best: dict[str, dict] = {}
    load_before = os.getloadavg()
    for _ in range(max(1, args.rounds)):
        for fmt in formats:
            row = run_round(fmt, args, batches)
            kept = best.setdefault(fmt, {"tok_s": {}, "load_s": row["load_s"]})
            for b, v in row["tok_s"].items():
                kept["tok_s"][b] = max(kept["tok_s"].get(b, 0.0), v)
            kept["tokens"] = row["tokens"]
    ref = best.get("fp32", {}).get("tokens")
    print(f"{'format':<14}" + "".join(f"{'batch ' + str(b):>12}" for b in batches) + "   identical to fp32")
    for fmt, row in best.items():
        same = "" if ref is None else f"{sum(a == b for a, b in zip(row['tokens'], ref))}/{len(ref)}"
        row["identical_to_fp32"] = same
        print(f"{fmt:<14}" + "".join(f"{row['tok_s'][b]:>12.1f}" for b in batches) + f"   {same}")
    if args.json:
        result = {**cpu_info(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "load_before": load_before, "load_after": os.getloadavg(), "threads": os.cpu_count(),
                  "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens, "rounds": args.rounds,
                  "formats": {f: {k: v for k, v in r.items() if k != "tokens"} for f, r in best.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
