"""The two transformers baselines of the throughput benchmark, on the same weights."""
from __future__ import annotations

import logging
import time

import torch

from gpu_worker.bench.workload import WorkItem

logger = logging.getLogger(__name__)


def load_hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def naive_static(model, items: list[WorkItem], batch_size: int = 8, pad_token_id: int = 0) -> tuple[float, list[list[int]]]:
    """``generate`` over left-padded static batches; each batch runs to its longest output.
    Returns (seconds, useful output tokens per request)."""
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        width = max(len(it.prompt_token_ids) for it in batch)
        ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, it in enumerate(batch):
            n = len(it.prompt_token_ids)
            ids[i, width - n:] = torch.tensor(it.prompt_token_ids)
            mask[i, width - n:] = 1
        longest = max(it.max_tokens for it in batch)
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                             do_sample=False, eos_token_id=None, pad_token_id=pad_token_id)
        for i, it in enumerate(batch):
            outputs.append(gen[i, width:width + it.max_tokens].tolist())
    return time.perf_counter() - t0, outputs


@torch.inference_mode()
def hf_continuous(model, items: list[WorkItem], max_new_tokens: int) -> tuple[float, list[list[int]]]:
    """transformers' own continuous batching (paged cache), per-request max_new_tokens."""
    from transformers import GenerationConfig

    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=gen_cfg)
    manager.start()
    t0 = time.perf_counter()
    try:
        ids = [manager.add_request(it.prompt_token_ids, max_new_tokens=it.max_tokens, eos_token_id=-1)
               for it in items]
        results = {}
        while len(results) < len(items):
            r = manager.get_result(timeout=600)
            if r is None:
                raise RuntimeError("transformers' continuous batching stopped returning results")
            results[r.request_id] = list(r.generated_tokens)
        elapsed = time.perf_counter() - t0
    finally:
        manager.stop(block=True)
    return elapsed, [results[i][:it.max_tokens] for i, it in zip(ids, items)]


def matmul_peak_gflops(seconds: float = 4.0, n: int = 1536, reps: int = 5) -> dict[str, float]:
    """Sustained fp32 GFLOP/s of an n x n x n product on this machine, measured now, by each
    matmul this process has: torch.mm (MKL here) and, where available, oneDNN with a packed
    weight (what the engine uses on the CPU). Each figure is the best mean over ``reps``
    back-to-back products (a single product can catch a frequency burst and overstate what
    the cores sustain). ``peak`` is the higher of the two: the compute limit must not be one
    that the engine's own kernels beat."""
    from gpu_worker.model.ops import onednn

    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    result = {"torch_mm": _best_gflops(lambda: torch.mm(a, b, out=out), n, seconds / 2, reps)}
    if onednn.available():
        packed = onednn.PackedLinear(b.t().contiguous())
        result["onednn"] = _best_gflops(lambda: packed(a), n, seconds / 2, reps)
    result["peak"] = max(result.values())
    return result


def _best_gflops(fn, n: int, seconds: float, reps: int) -> float:
    fn()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = max(best, reps * 2 * n**3 / (time.perf_counter() - t) / 1e9)
    return best
