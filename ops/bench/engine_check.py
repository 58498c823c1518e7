"""The engine end to end on the GPU: a tiny random Llama built here (its own word-level
tokenizer, so nothing is downloaded), greedy generation on CUDA (Triton ops) against the
CPU torch ops, INT8/INT4 quantized engines, and CUDA-graph decode against eager decode.

Used by gpu_check.py. Without CUDA (--dry-run) the same code runs the Triton ops under the
interpreter on the CPU and the graph path eagerly (capture needs CUDA).
"""

import json
import os
import tempfile
import time
from pathlib import Path

import torch

VOCAB = 512


def make_offline_model(path: Path, num_layers: int = 2, hidden: int = 128, heads: int = 4, kv_heads: int = 2) -> str:
    """A random-weight Llama directory with a word-level tokenizer ("t0".."t511")."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0",
                            pad_token="t0").save_pretrained(str(path))
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden,
                         num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=1024, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():   # large init: next-token choices are clear, not numerical ties
        for name, p in model.named_parameters():
            p.normal_(0, 0.08) if p.dim() > 1 else p.normal_(0, 0.1).add_(1.0 if "norm" in name else 0.0)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    config.save_pretrained(str(path))
    return str(path)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (int(length),), generator=g).tolist()
            for length in torch.randint(3, 60, (n,), generator=g)]


def _generate(model_dir: str, device: str, ops: str, prompts, max_tokens: int, quantization: str | None = None):
    from gpu_worker import LLM, SamplingParams

    # Quantized at load, as a served model is: before the decode graphs are captured (they
    # hold the addresses of the weights they read).
    llm = LLM(model_dir, device=device, ops_backend=ops, kv_cache_memory=32 << 20, block_size=16,
              max_num_batched_tokens=128, quantization=quantization, quant_cache=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, ignore_eos=True, max_tokens=max_tokens))
    return llm, [o.token_ids for o in outs], time.perf_counter() - start


def _match(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / max(1, sum(len(r) for r in a))


def _graph_vs_eager(llm, device: torch.device, capture: bool) -> dict:
    """Bring a few requests into decode, then run one decode step eagerly and through the
    (captured) padded decode graph on the same inputs."""
    from gpu_worker.model.cuda_graphs import DecodeGraphs
    from gpu_worker.sampling_params import SamplingParams

    eng = llm.engine
    for i, n in enumerate((5, 17, 33)):
        eng.add_request(f"g{i}", list(range(10, 10 + n)), SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    batch = eng.runner.prepare(eng.scheduler.schedule())
    caches = eng.runner.kv_caches
    graphs = DecodeGraphs(eng.model, caches, max_batch=8, max_blocks_per_seq=64, sizes=[1, 2, 4, 8], capture=capture)
    plan = eng.model.ops.plan_attention(batch.meta)
    eager = eng.model(batch.input_ids, batch.positions, caches, plan).clone()
    replayed = graphs.run(batch.input_ids, batch.positions, batch.meta).clone()
    row = {"num_decodes": batch.meta.num_decodes, "captured": bool(graphs.graphs),
           "max_abs_diff": float((eager - replayed).abs().max()),
           "argmax_equal": bool(torch.equal(eng.model.compute_logits(eager).argmax(-1),
                                            eng.model.compute_logits(replayed).argmax(-1)))}
    if device.type == "cuda":
        from bench_utils import time_seconds

        row["eager_step_ms"] = 1e3 * time_seconds(lambda: eng.model(batch.input_ids, batch.positions, caches, plan), device)
        row["graph_step_ms"] = 1e3 * time_seconds(lambda: graphs.run(batch.input_ids, batch.positions, batch.meta), device)
    return row


def run(device: torch.device, dry_run: bool) -> dict:
    """Everything above, as one JSON-able dict (errors recorded per part by the caller)."""
    work = Path(tempfile.mkdtemp(prefix="engine-check-"))
    model_dir = make_offline_model(work / "tiny-llama")
    prompts = _prompts(3 if dry_run else 16)
    n = 4 if dry_run else 32
    result: dict = {"prompts": len(prompts), "max_tokens": n}
    _, ref, ref_s = _generate(model_dir, "cpu", "torch", prompts, n)
    dev = str(device)   # triton on a CPU device too: the interpreter stands in for the GPU
    llm, got, got_s = _generate(model_dir, dev, "triton", prompts, n)
    result["fp32"] = {"ops": llm.engine.model.ops.name, "token_match_vs_cpu_torch": _match(ref, got),
                      "exact": got == ref, "cpu_s": ref_s, "device_s": got_s}
    result["graphs"] = _graph_vs_eager(llm, device, capture=device.type == "cuda")
    del llm
    for spec in ("int8", "int4-g32"):
        _, qref, _ = _generate(model_dir, "cpu", "torch", prompts, n, spec)
        _, qgot, q_s = _generate(model_dir, dev, "triton", prompts, n, spec)
        result[spec] = {"token_match_vs_cpu_same_quant": _match(qref, qgot), "token_match_vs_fp32": _match(ref, qgot),
                        "device_s": q_s}
    return result


if __name__ == "__main__":
    import sys

    sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    print(json.dumps(run(dev, dry_run=dev.type != "cuda"), indent=1))
