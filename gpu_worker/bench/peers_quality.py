"""``fleet bench peers --quality``: llama.cpp's own formats (F32, Q8_0, Q4_K_M, Q4_1 GGUFs
made from the same weights) against this engine's fp32, on ``quant_quality``'s prompts and
text.

The prompts go through this project's chat template and tokenizer, so llama.cpp sees the
very token ids this engine sees. Per format: free-running greedy outputs (``--quality-tokens``
each, ignore_eos) against this engine's fp32 and against llama.cpp F32 (requests identical,
mean fraction of tokens before the first divergence), and the perplexity of
``quant_quality.TEXT``'s token ids computed the same way on both sides: one teacher-forced
pass, logits of every position, exp of the mean next-token cross-entropy (no BOS added,
no chunking; llama.cpp's logits read through llama-cpp-python's bindings).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from gpu_worker.bench import peers_discovery as disc
from gpu_worker.bench.peers_report import agreement
from gpu_worker.bench.pictures import machine

RUNNER = Path(__file__).with_name("peers_llama_quality_runner.py")


def add_quality_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--quality")
    g.add_argument("--quality", action="store_true", help="llama.cpp's formats vs this engine's fp32 "
                   "(greedy agreement, perplexity) instead of speed")
    g.add_argument("--quality-formats", default="F32,Q8_0,Q4_K_M,Q4_1")
    g.add_argument("--quality-prompts", type=int, default=32)
    g.add_argument("--quality-tokens", type=int, default=64)


def engine_reference(model: str | None, num_prompts: int, tokens: int) -> dict:
    """This engine's fp32 greedy outputs and perplexity, and the token ids they came from."""
    from gpu_worker.bench.quant_quality import PROMPTS, TEXT, perplexity
    from gpu_worker.llm import LLM
    from gpu_worker.sampling_params import SamplingParams

    llm = LLM(model, kv_cache_memory=256 << 20)
    prompts = [llm.encode([{"role": "user", "content": q}]) for q in (PROMPTS * 4)[:num_prompts]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    text_ids = llm.tokenizer.encode(TEXT)
    return {"prompts": prompts, "text_ids": text_ids, "outputs": [o.token_ids for o in outs],
            "perplexity": perplexity(llm.engine.model, text_ids)}


def compare(ref: dict, llama: dict[str, dict]) -> dict[str, dict]:
    """Per format: perplexity, agreement with this engine's fp32 and with llama.cpp F32."""
    base = llama.get("F32", {}).get("outputs")
    rows = {}
    for fmt, r in llama.items():
        rows[fmt] = {"perplexity": r["perplexity"], "vs_engine_fp32": agreement(ref["outputs"], r["outputs"])}
        if base is not None:
            rows[fmt]["vs_llama_f32"] = agreement(base, r["outputs"])
    return rows


def quality_table(engine_ppl: float, rows: dict[str, dict]) -> str:
    lines = ["| weights | perplexity | vs this engine fp32 | vs llama.cpp F32 |", "|---|---|---|---|",
             f"| this engine fp32 | {engine_ppl:.3f} | — | |"]
    for fmt, r in rows.items():
        cells = [f"{a['identical']}/{a['requests']}, {a['prefix_fraction']:.1%}" if a else ""
                 for a in (r["vs_engine_fp32"], r.get("vs_llama_f32"))]
        lines.append(f"| llama.cpp {fmt} | {r['perplexity']:.3f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def run_quality(args: argparse.Namespace) -> int:
    formats = tuple(f.strip() for f in args.quality_formats.split(",") if f.strip())
    found, bindings = disc.find_llama(formats=formats), disc.find_llama_bindings()
    missing = found.missing or bindings.missing
    if missing:
        print(f"llama.cpp quality comparison skipped: {missing}")
        return 0
    ref = engine_reference(args.model, args.quality_prompts, args.quality_tokens)
    job = {"ggufs": {f: str(found.paths[f]) for f in formats}, "prompts": ref["prompts"],
           "tokens": args.quality_tokens, "text_ids": ref["text_ids"], "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(bindings.paths["lib_dir"])}
        subprocess.run([str(bindings.paths["python"]), str(RUNNER), str(job_path), str(out_path)],
                       env=env, check=True, timeout=3600)
        llama = json.loads(out_path.read_text())
    rows = compare(ref, llama)
    result = {**machine(), "prompts": len(ref["prompts"]), "tokens": args.quality_tokens,
              "text_tokens": len(ref["text_ids"]), "engine_fp32_perplexity": ref["perplexity"],
              "llama_cpp": rows, "peer_versions": disc.versions(), "threads": args.threads}
    result["table"] = quality_table(ref["perplexity"], rows)
    print(result["table"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
