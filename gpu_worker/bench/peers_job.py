"""One benchmark job, the same for every engine of ``fleet bench peers``: time the workload
after a warm-up, then the batch-1 figure, given only a ``generate`` callable.

Standard library only: the vLLM runner imports this file from vLLM's own venv, where this
project is not installed.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# generate(prompts, max_tokens) -> one list of output token ids per prompt, greedy, each
# exactly max_tokens long (ignore_eos)
Generate = Callable[[list[list[int]], list[int]], list[list[int]]]


def run_job(job: dict, generate: Generate) -> dict:
    """``job``: {"workload": [[prompt_ids, max_tokens], ...], "batch1": {"prompt": ids,
    "tokens": n, "reps": r}}. Returns the workload's wall seconds and outputs, and batch 1's
    decode and end-to-end tokens/s (medians over ``reps``)."""
    prompts = [p for p, _ in job["workload"]]
    lengths = [n for _, n in job["workload"]]
    t0 = time.perf_counter()
    generate([prompts[0][:8]], [2])
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = generate(prompts, lengths)
    workload_s = time.perf_counter() - t0
    short = [i for i, (o, n) in enumerate(zip(outputs, lengths)) if len(o) != n]
    if short:
        raise RuntimeError(f"requests {short[:5]} did not generate exactly max_tokens")
    return {"warmup_s": warmup_s, "workload_s": workload_s, "outputs": outputs,
            "batch1": batch1(generate, job["batch1"]["prompt"], job["batch1"]["tokens"], job["batch1"]["reps"])}


def batch1(generate: Generate, prompt: list[int], tokens: int, reps: int) -> dict:
    """One request alone: end-to-end tokens/s of ``tokens`` tokens, and decode tokens/s from
    the difference with a 1-token request (which is prefill plus the first token)."""
    first = [_seconds(generate, prompt, 1) for _ in range(reps)]
    full = [_seconds(generate, prompt, tokens) for _ in range(reps)]
    t1, tn = statistics.median(first), statistics.median(full)
    return {"prompt_tokens": len(prompt), "tokens": tokens, "reps": reps, "first_token_s": t1, "total_s": tn,
            "e2e_tok_s": tokens / tn, "decode_tok_s": (tokens - 1) / (tn - t1)}


def _seconds(generate: Generate, prompt: list[int], n: int) -> float:
    t0 = time.perf_counter()
    out = generate([prompt], [n])
    seconds = time.perf_counter() - t0
    if len(out[0]) != n:
        raise RuntimeError(f"batch-1 request gave {len(out[0])} tokens, not {n}")
    return seconds


def main(generate_factory: Callable[[dict], tuple[Generate, dict]]) -> int:
    """``python RUNNER JOB.json OUT.json``: builds the engine from the job, runs it, writes
    the result with whatever the factory reports about the engine (versions, settings).

    With ``job["control"]`` (a folder) the runner stays loaded for ``job["rounds"]`` rounds
    that the parent starts one at a time, so that engines can take turns: it writes
    ``ready`` once built, then for each round r waits for ``go.<r>``, runs the job and
    writes ``out.<r>.json`` (OUT.json is not written)."""
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    t0 = time.perf_counter()
    generate, info = generate_factory(job)
    load_s = time.perf_counter() - t0
    control = job.get("control")
    if not control:
        _write(Path(out_path), {"load_s": load_s, **info, **run_job(job, generate)})
        return 0
    folder = Path(control)
    _write(folder / "ready", {"load_s": load_s})
    for r in range(int(job.get("rounds", 1))):
        while not (folder / f"go.{r}").exists():
            time.sleep(0.05)
        _write(folder / f"out.{r}.json", {"load_s": load_s, **info, **run_job(job, generate)})
    return 0


def _write(path: Path, result: dict) -> None:
    """JSON into ``path`` at once (renamed into place: a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, path)
