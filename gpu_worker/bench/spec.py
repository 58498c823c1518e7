"""``fleet bench spec``: speculative decoding proposers side by side, in one process.

Batch-1 decode speed without and with each proposer (``--proposers``: n-gram, early-exit and
int8/int4 self-drafts, a truncated draft model) on an input-grounded workload (repeat,
quote, summarise or edit a given text: n-gram material) and on open chat prompts; each
proposer's acceptance rate and mean accepted length; and mixed-workload throughput at 32
concurrent requests with and without speculation (adaptive depth on).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from gpu_worker.bench.workload import mixed_workload

logger = logging.getLogger(__name__)

TEXT = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all day long, "
        "while the fox runs through the forest looking for food. In the evening, both animals rest "
        "under the old oak tree.")
CODE = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\nprint(add(2, 3), mul(4, 5))\n"
# Input-grounded: repeat, quote, edit (text and code) and summarise a given text.
GROUNDED = [f"Repeat the following text exactly:\n\n{TEXT}",
            f"Quote this text exactly, inside double quotes:\n\n{TEXT}",
            f"Rewrite this text, replacing 'fox' with 'cat':\n\n{TEXT}",
            f"Add a docstring to each function in this code and return the whole code:\n\n{CODE}",
            f"Summarize this text in two sentences:\n\n{TEXT}"]
CHAT = ["Write a short poem about the sea.", "Give three tips for learning to cook.",
        "Explain what a black hole is to a child.", "Describe your ideal weekend."]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--draft-model", default=None, help="draft model dir (default: SmolLM2's first 8 layers)")
    p.add_argument("--self-draft-layers", type=int, default=None)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--concurrent", type=int, default=32)
    p.add_argument("--proposers", default=",".join(PROPOSERS),
                   help=f"comma-separated, of {','.join(PROPOSERS)} (default: all)")
    p.add_argument("--json", type=Path, default=None)


# What each proposer name builds: the engine's speculative options. The quantized self-drafts
# are the target's own weights at int8 / int4 (calibrated as --quantization int4 is).
PROPOSERS = {"ngram": {"speculative": "ngram"}, "self": {"speculative": "self"}, "draft": {"speculative": "draft"},
             "self-int8": {"speculative": "self", "self_draft_quantization": "int8"},
             "self-int4": {"speculative": "self", "self_draft_quantization": "int4"}}


def run(args: argparse.Namespace) -> int:
    from gpu_worker.llm import LLM

    draft = args.draft_model or (_truncated_draft(args.model, 8) if "draft" in args.proposers.split(",") else None)
    result: dict = {"num_speculative_tokens": args.num_speculative_tokens, "max_tokens": args.max_tokens,
                    "draft_model": Path(draft).name if draft else None}
    base = LLM(args.model, kv_cache_memory=1 << 30)
    tok = base.tokenizer
    workloads = {"grounded": [tok.apply_chat_template([{"role": "user", "content": p}]) for p in GROUNDED],
                 "chat": [tok.apply_chat_template([{"role": "user", "content": p}]) for p in CHAT]}
    kinds = [k for k in args.proposers.split(",") if k]
    unknown = [k for k in kinds if k not in PROPOSERS]
    if unknown:
        raise SystemExit(f"unknown proposers {unknown}: choose from {list(PROPOSERS)}")
    for kind in kinds:
        llm = LLM(args.model, kv_cache_memory=256 << 20, draft_model=draft, **PROPOSERS[kind],
                  num_speculative_tokens=args.num_speculative_tokens, self_draft_layers=args.self_draft_layers)
        # A fresh baseline per proposer: one that served the same prompts in an earlier turn
        # would find them in its prefix cache and skip the prefill the proposer pays for.
        pair_base = LLM(args.model, kv_cache_memory=256 << 20)
        per: dict = {}
        for name, prompts in workloads.items():
            # Paired: baseline and proposer alternate prompt by prompt, so drift in the
            # machine's speed hits both alike.
            base_rate, spec_rate = _paired_batch1(pair_base, llm, prompts, args.max_tokens)
            result.setdefault(f"baseline_{name}_tok_s", []).append(base_rate)
            per[f"{name}_tok_s"] = spec_rate
            result[f"{kind}_{name}_speedup"] = spec_rate / base_rate
        stats = llm.engine.stats()
        per["acceptance_rate"] = stats["spec_acceptance_rate"]
        per["mean_accepted_length"] = stats["spec_mean_accepted_length"]
        per["drafted_tokens"] = stats["spec_drafted_tokens"][PROPOSERS[kind]["speculative"]]
        result[kind] = per
        logger.info("%s: %s", kind, per)
    items = mixed_workload(args.concurrent, seed=1)
    spec_llm = LLM(args.model, kv_cache_memory=1 << 30, speculative="ngram",
                   num_speculative_tokens=args.num_speculative_tokens)
    plain, with_spec = 0.0, 0.0
    for _ in range(2):          # alternate, twice: the machine's speed drifts
        plain += _throughput(base, items) / 2
        with_spec += _throughput(spec_llm, items) / 2
    result.update(concurrent32_plain_tok_s=plain, concurrent32_spec_tok_s=with_spec,
                  concurrent32_ratio=with_spec / plain,
                  concurrent32_spec_drafted=spec_llm.engine.stats()["spec_drafted_tokens"]["ngram"])
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def _paired_batch1(base, llm, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
    """Batch-1 decode tokens/s of ``base`` and ``llm``, measured prompt by prompt in turn."""
    from gpu_worker.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    totals = {id(base): [0, 0.0], id(llm): [0, 0.0]}
    for p in prompts:
        for engine in (base, llm):
            t0 = time.perf_counter()
            out = engine.generate([p], params)[0]
            totals[id(engine)][1] += time.perf_counter() - t0
            totals[id(engine)][0] += len(out.token_ids)
    return tuple(n / s for n, s in (totals[id(base)], totals[id(llm)]))


def _throughput(llm, items) -> float:
    from gpu_worker.sampling_params import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=i.max_tokens, ignore_eos=True) for i in items]
    t0 = time.perf_counter()
    outs = llm.generate([i.prompt_token_ids for i in items], params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def _truncated_draft(model: str | None, num_layers: int) -> str:
    """A draft model with the target's tokenizer: its first ``num_layers`` layers, saved once."""
    import shutil

    from gpu_worker.model.default_model import cache_root
    from gpu_worker.model.loader import load_state_dict, resolve_model_dir

    src = resolve_model_dir(model)
    out = cache_root() / "models" / f"{src.name}-first{num_layers}"
    if (out / "model.safetensors").exists():
        return str(out)
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    state = {k: v for k, v in load_state_dict(src).items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(out)
