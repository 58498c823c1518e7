"""How the grammar library was chosen: ``python -m gpu_worker.structured.measure``.

xgrammar and llguidance (``pip install llguidance``; not a dependency) on the embedded
SmolLM2 tokenizer (vocabulary 49,152): the tokenizer's one-off indexing, one JSON Schema's
compilation, and the time to compute one token mask along a valid output.
"""
from __future__ import annotations

import json
import statistics
import time

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "address": {"type": "object", "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string"},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
TEXT = '{"name": "Alice Smith", "age": 42, "tags": ["a", "bb"], "address": {"city": "Paris", "zip": "75001"}}'
VOCAB = 49152


def _masks(fill, accept, ids: list[int]) -> dict:
    times = []
    for t in ids:
        t0 = time.perf_counter()
        fill()
        times.append(time.perf_counter() - t0)
        assert accept(t), t
    return {"mask_median_us": statistics.median(times) * 1e6, "mask_mean_us": statistics.mean(times) * 1e6,
            "mask_max_us": max(times) * 1e6}


def xgrammar_figures(hf, ids: list[int]) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB, stop_token_ids=[hf.eos_token_id])
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_json_schema(json.dumps(SCHEMA))
    t2 = time.perf_counter()
    m, bitmask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, VOCAB)
    return {"tokenizer_s": t1 - t0, "compile_ms": (t2 - t1) * 1e3,
            **_masks(lambda: m.fill_next_token_bitmask(bitmask), m.accept_token, ids)}


def llguidance_figures(hf, ids: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB)
    t1 = time.perf_counter()
    m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
    t2 = time.perf_counter()
    bitmask = llguidance.torch.allocate_token_bitmask(1, VOCAB)
    return {"tokenizer_s": t1 - t0, "compile_ms": (t2 - t1) * 1e3,
            **_masks(lambda: llguidance.torch.fill_next_token_bitmask(m, bitmask, 0), m.consume_token, ids)}


def main() -> None:
    from transformers import AutoTokenizer

    from gpu_worker.model.default_model import default_model_dir

    hf = AutoTokenizer.from_pretrained(str(default_model_dir()))
    ids = hf(TEXT, add_special_tokens=False)["input_ids"]
    out = {"tokens": len(ids), "xgrammar": xgrammar_figures(hf, ids)}
    try:
        out["llguidance"] = llguidance_figures(hf, ids)
    except ImportError:
        out["llguidance"] = "not installed"
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
