"""The runner of this engine for ``fleet bench peers``, in a process of its own:

    python -m gpu_worker.bench.peers_engine JOB.json OUT.json [engine arguments...]

Engine arguments are those of ``fleet worker`` (``--quantization int8``, ``--dtype ...``);
DEFAULT_ARGS come first, so any of them can be overridden.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from gpu_worker.bench.peers_job import Generate, main

# As ``fleet bench throughput`` runs it, on 2 threads; prefix caching off so that the
# batch-1 repetitions of one prompt are not served from the cache (the peers' is off too).
DEFAULT_ARGS = ["--kv-cache-memory", "4GiB", "--max-num-seqs", "64", "--max-num-batched-tokens", "1024",
                "--threads", "2", "--no-prefix-caching"]


def engine_options(model: str | None, argv: list[str]) -> dict:
    """LLM keyword options from ``fleet worker``-style engine arguments."""
    from gpu_worker.edge.cli import add_engine_arguments, engine_config

    parser = argparse.ArgumentParser(prog="peers_engine")
    add_engine_arguments(parser)
    args = parser.parse_args(DEFAULT_ARGS + (["--model", model] if model else []) + argv)
    config = engine_config(args)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _factory(engine_argv: list[str]):
    def build(job: dict) -> tuple[Generate, dict]:
        import torch

        from gpu_worker.llm import LLM
        from gpu_worker.sampling_params import SamplingParams

        options = engine_options(job.get("model"), engine_argv)
        llm = LLM(**options)

        def generate(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
            params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
            return [o.token_ids for o in llm.generate(prompts, params)]

        settings = {k: options[k] for k in ("dtype", "quantization", "num_threads", "max_num_seqs",
                                            "max_num_batched_tokens", "enable_prefix_caching")}
        return generate, {"version": f"torch {torch.__version__}", "threads": torch.get_num_threads(),
                          "ops": llm.engine.model.ops.name, "settings": settings}
    return build


if __name__ == "__main__":
    raise SystemExit(main(_factory(sys.argv[3:])))
