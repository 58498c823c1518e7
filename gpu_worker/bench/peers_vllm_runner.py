"""The runner of vLLM's CPU build for ``fleet bench peers``, run by the Python of vLLM's own
venv (this project is not installed there, so it imports only ``peers_job`` beside it):

    VLLM-VENV/bin/python peers_vllm_runner.py JOB.json OUT.json

Offline ``LLM.generate`` on token-id prompts, float32 (or the job's ``dtype``), greedy, exactly max_tokens
(min_tokens = max_tokens, ignore_eos). Threads, KV space and preloads come from the
environment the parent sets (peers_discovery.vllm_env).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers_job import Generate, main  # noqa: E402


def build(job: dict) -> tuple[Generate, dict]:
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    dtype = job.get("dtype", "float32")
    llm = LLM(model=job["model"], dtype=dtype, seed=0, enable_prefix_caching=False,
              max_num_seqs=job.get("max_num_seqs", 64), max_model_len=job.get("max_model_len", 2048))

    def generate(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
        params = [SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in lengths]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    env = {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD")}
    return generate, {"version": f"vllm {vllm.__version__}, torch {torch.__version__}",
                      "threads": torch.get_num_threads(), "settings": {"dtype": dtype, **env}}


if __name__ == "__main__":
    raise SystemExit(main(build))
