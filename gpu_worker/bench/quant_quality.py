"""``fleet bench quant``: weight-only INT8 / INT4 against fp32 on the same model.

For each method: weight memory, perplexity on a fixed text, and greedy agreement with fp32
over ``--tokens`` tokens for ``--prompts`` chat prompts, measured two ways:

- teacher-forced (the headline): the quantized model reads prompt + fp32's greedy output
  and its argmax is compared with fp32's token at every position. This is exactly the
  acceptance rate of a greedy self-draft (speculative decoding with the quantized model
  drafting for the float one);
- free-running: each model generates on its own; the share of positions that match, the
  mean length of the identical prefix (one early flip changes everything after it) and
  that prefix as a fraction of all tokens (issue 18's metric), also for the first 4 prompts.

The prompts are held out: none is in the calibration text (``calibration.py``).

Also times the CPU matmul choices of ``gpu_worker/model/quant.py``.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gpu_worker.bench.timing import mean_seconds
from gpu_worker.model.quant.calibration import prefill_hidden

logger = logging.getLogger(__name__)

FIRST = 4   # the "4 x 64 greedy tokens": the first prompts, reported apart

PROMPTS = [
    "What is the capital of France?", "Explain photosynthesis in simple terms.",
    "Write a haiku about the sea.", "How do I reverse a list in Python?",
    "What causes the seasons on Earth?", "Give me three tips for better sleep.",
    "What is the difference between a virus and a bacterium?", "Summarize the plot of Romeo and Juliet.",
    "How does a refrigerator work?", "What is a prime number?",
    "Write a short story about a robot who learns to paint.", "Why is the sky blue?",
    "List the planets of the solar system.", "What is machine learning?",
    "How do vaccines work?", "Translate 'good morning' into Spanish and French.",
    "What are the benefits of regular exercise?", "Explain what an API is to a child.",
    "How do airplanes stay in the air?", "What is the Pythagorean theorem?",
    "Describe a healthy breakfast.", "What is inflation in economics?",
    "How can I improve my writing skills?", "What is the water cycle?",
    "Write a limerick about a cat.", "What does DNA stand for and what does it do?",
    "How do I make a cup of tea?", "What is the tallest mountain in the world?",
    "Explain the rules of chess briefly.", "What is climate change?",
    "Give an example of a metaphor.", "How does the internet work?",
]

TEXT = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe "
    "experimented with two-wheeled machines that riders pushed along with their feet. These early "
    "designs had no pedals, and they were heavy, uncomfortable and difficult to steer. Over the "
    "following decades, engineers added cranks and pedals to the front wheel, which made the "
    "machines faster but also more dangerous, because the rider sat high above a very large wheel. "
    "The safety bicycle, introduced in the 1880s, solved many of these problems. It had two wheels "
    "of similar size, a chain that drove the rear wheel, and a frame that kept the rider close to "
    "the ground. Pneumatic tires, developed soon afterwards, made riding smoother on rough roads. "
    "Within a few years, bicycles became popular across the world. They gave ordinary people a "
    "cheap and independent way to travel, and they played a part in social changes, including "
    "greater freedom of movement for women. Today, bicycles are used for commuting, sport and "
    "recreation, and many cities build dedicated lanes to make cycling safer and more attractive. "
    "Because they produce no emissions and take little space, bicycles are often seen as an "
    "important part of sustainable transport in crowded urban areas."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--methods", default="int8,int4,int4-rtn",
                   help="comma-separated: int8, int4, int4-g64, int4-g32; a -rtn suffix quantizes without calibration")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--skip-free-running", action="store_true", help="teacher-forced agreement only (faster)")
    p.add_argument("--skip-timings", action="store_true")
    p.add_argument("--json", type=Path, default=Path("quant_quality.json"))


def forward_logits(model, token_ids: list[int]) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of one sequence, prefilled in one pass over fresh caches."""
    return model.compute_logits(prefill_hidden(model, token_ids)).cpu()


def perplexity(model, token_ids: list[int]) -> float:
    logits = forward_logits(model, token_ids)
    nll = F.cross_entropy(logits[:-1], torch.tensor(token_ids[1:]))
    return float(torch.exp(nll))


def teacher_forced_argmax(model, prompt: list[int], continuation: list[int]) -> list[int]:
    """The model's greedy choice at each continuation position, given the true prefix."""
    logits = forward_logits(model, prompt + continuation[:-1])
    return logits[len(prompt) - 1:].argmax(-1).tolist()


def agreement(ref: list[list[int]], other: list[list[int]]) -> dict:
    """Per-position agreement with ``ref``, the mean length of the identical prefix, and
    that prefix as a fraction of the tokens (issue 18's free-running metric: the share of
    tokens generated before the first divergence, over all sequences)."""
    total = sum(len(r) for r in ref)
    same = sum(a == b for r, o in zip(ref, other) for a, b in zip(r, o))
    prefix = []
    for r, o in zip(ref, other):
        k = next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), min(len(r), len(o)))
        prefix.append(k)
    return {"token_agreement": same / total, "mean_identical_prefix": sum(prefix) / len(prefix),
            "prefix_fraction": sum(prefix) / total}


def free_running(ref: list[list[int]], other: list[list[int]], head: int = FIRST) -> dict:
    """:func:`agreement` of free-running outputs over all prompts, with the prefix fraction
    of the first ``head`` prompts alone (the 4 x 64 tokens issue 18 quotes)."""
    return {**agreement(ref, other), f"prefix_fraction_first{head}": agreement(ref[:head], other[:head])[
        "prefix_fraction"]}


def table(result: dict) -> str:
    """A markdown table of a result's methods: bytes, perplexity, agreement."""
    fp32 = result["fp32"]
    lines = [f"| method | linear-layer MB | perplexity | teacher-forced | free-running prefix (first {FIRST}) |",
             "|---|---|---|---|---|",
             f"| fp32 | {fp32['linear_weight_bytes'] / 1e6:.1f} | {fp32['perplexity']:.2f} | 100 % | 100 % |"]
    for name, row in result["methods"].items():
        fr = row.get("free_running")
        prefix = f"{_pct(fr['prefix_fraction'])} ({_pct(fr[f'prefix_fraction_first{FIRST}'])})" if fr else "-"
        lines.append(f"| {name} | {row['linear_weight_bytes'] / 1e6:.1f} | {row['perplexity']:.2f} | "
                     f"{_pct(row['teacher_forced']['token_agreement'])} | {prefix} |")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def cpu_matmul_timings(shapes=((576, 1536), (3072, 576)), ms=(1, 32, 256), reps: int = 10) -> list[dict]:
    """Microseconds per [M, K] x [K, N] product: fp32 vs the CPU quantized choices."""
    from kernels.quantize import dequantize_int4, quantize_int4, quantize_int8, unpack_int4
    from gpu_worker.model.quant.quantize import int4_group_for

    def timed(fn) -> float:
        return mean_seconds(fn, reps) * 1e6

    rows = []
    for n, k in shapes:
        w = torch.randn(n, k) * 0.05
        q8, s8 = quantize_int8(w)
        g = int4_group_for(k, 128)
        p4, sc, mn = quantize_int4(w, g)
        torch_int4 = torch._convert_weight_to_int4pack_for_cpu(unpack_int4(p4).to(torch.int32), 2)
        zeros = torch.stack([sc, mn + 8 * sc], -1).transpose(0, 1).contiguous()  # torch: (q - 8) * s + z
        for m in ms:
            x = torch.randn(m, k)
            rows.append({"n": n, "k": k, "m": m, "fp32_us": timed(lambda: F.linear(x, w)),
                         "int8_dequant_us": timed(lambda: F.linear(x, q8.float()) * s8),
                         "int8pack_mm_us": timed(lambda: torch._weight_int8pack_mm(x, q8, s8)),
                         "int4_dequant_us": timed(lambda: F.linear(x, dequantize_int4(p4, sc, mn, g))),
                         "int4pack_mm_us": timed(lambda: torch._weight_int4pack_mm_for_cpu(x, torch_int4, g, zeros))})
            logger.info("timings %s", rows[-1])
    return rows


def _generate(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    from gpu_worker.sampling_params import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return [o.token_ids for o in outs]


def _load(args, spec: str | None):
    """An engine on the weights, quantized at load as ``--quantization`` would (INT4 with
    activation-aware scales). ``int4-rtn`` (or ``int4-g64-rtn``, ...) quantizes the loaded
    fp32 model without calibration, for comparison."""
    from gpu_worker.llm import LLM
    from gpu_worker.model.quant.quantize import quantize_model

    plain = bool(spec) and spec.endswith("-rtn")
    method = spec[:-len("-rtn")] if plain else spec
    llm = LLM(args.model, kv_cache_memory=256 << 20, quantization=None if plain else method)
    if plain:
        quantize_model(llm.engine.model, method)
    return llm


def run(args: argparse.Namespace) -> int:
    from gpu_worker.model.quant.quantize import weight_bytes

    started = time.perf_counter()
    fp32 = _load(args, None)
    prompts = [fp32.encode([{"role": "user", "content": q}]) for q in (PROMPTS * 4)[:args.prompts]]
    text_ids = fp32.tokenizer.encode(TEXT)
    ref_gen = _generate(fp32, prompts, args.tokens)
    result = {"model": fp32.engine.model_dir.name, "prompts": len(prompts), "tokens": args.tokens,
              "text_tokens": len(text_ids), "threads": torch.get_num_threads(), "methods": {}}
    model = fp32.engine.model
    ref_tf = [teacher_forced_argmax(model, p, c) for p, c in zip(prompts, ref_gen)]
    result["fp32"] = {**weight_bytes(model), "perplexity": perplexity(model, text_ids),
                      "teacher_forced_self_agreement": agreement(ref_gen, ref_tf)["token_agreement"]}
    logger.info("fp32: %s", result["fp32"])
    del fp32, model
    for spec in [s.strip() for s in args.methods.split(",") if s.strip()]:
        llm = _load(args, spec)
        model = llm.engine.model
        tf = [teacher_forced_argmax(model, p, c) for p, c in zip(prompts, ref_gen)]
        row = {**weight_bytes(model), "perplexity": perplexity(model, text_ids),
               "teacher_forced": agreement(ref_gen, tf)}
        row["weight_bytes_vs_fp32"] = row["linear_weight_bytes"] / result["fp32"]["linear_weight_bytes"]
        if not args.skip_free_running:
            row["free_running"] = free_running(ref_gen, _generate(llm, prompts, args.tokens))
        result["methods"][spec] = row
        logger.info("%s: %s", spec, row)
        _write(args.json, result)
        del llm, model
    if not args.skip_timings:
        result["cpu_matmul_timings"] = cpu_matmul_timings()
    result["wall_s"] = time.perf_counter() - started
    _write(args.json, result)
    print(table(result))
    return 0


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
