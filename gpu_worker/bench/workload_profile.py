"""Where the mixed throughput workload's time goes, part by part and by step size.

    python -m gpu_worker.bench.workload_profile [--requests 64] [--runs 2] [engine arguments...]

Runs the workload of ``fleet bench throughput`` / ``fleet bench peers`` (``mixed_workload``,
greedy, fixed lengths) through this engine built as ``fleet bench peers`` builds it
(``peers_engine.DEFAULT_ARGS``: 2 threads, prefix caching off), once to warm up, then
``--runs`` times with timers around the parts of a step (``decode_profile.instrument``:
schedule, batch preparation, attention planning, matmuls, attention, glue, LM head, greedy
head, sampling, update). Each forward pass is also filed by its kind and number of rows:
all-decode steps ("fused decode" where the model has the fused C layers, else "decode"), and
the rest ("prefill": chunked-prefill steps, decode rows included), in row buckets. Prints seconds per run.
The timers cost about a microsecond each, ~130 a per-op step: the parts sum to a little
more than an untimed run, whose wall time is printed beside them for scale.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

from gpu_worker.bench.decode_profile import INNER, PARTS, Timers, add_others, instrument
from gpu_worker.bench.peers_engine import engine_options
from gpu_worker.bench.workload import mixed_workload

BUCKETS = (1, 8, 12, 24, 48, 128, 512, 1024)   # upper bounds of the row buckets


def bucket(rows: int) -> str:
    lo = 1
    for hi in BUCKETS:
        if rows <= hi:
            return f"{lo}-{hi}" if hi > lo else f"{hi}"
        lo = hi + 1
    return f">{BUCKETS[-1]}"


def file_forwards(model, timers: Timers, steps: dict) -> None:
    """Wrap ``model.forward`` so that each timed call goes to (kind, row bucket) in ``steps``:
    its seconds, calls, rows, context tokens (the sum of its sequences' lengths) and the
    seconds of the INNER parts timed inside it."""
    forward = model.forward

    def filed(input_ids, positions, kv_caches, plan, keep=None):
        if not timers.on:
            return forward(input_ids, positions, kv_caches, plan, keep=keep)
        rows = int(input_ids.shape[0])
        meta = getattr(plan, "meta", None)
        # every row a decode row (on the cpu backend, short chunks' rows count: attention.py)
        decode = getattr(plan, "decode_rows", getattr(meta, "num_decodes", -1)) == rows
        kind = ("fused decode" if model.fused_decode is not None else "decode") if decode else "prefill"
        before = {k: timers.seconds.get(k, 0.0) for k in INNER}
        t0 = timers.clock()
        try:
            return forward(input_ids, positions, kv_caches, plan, keep=keep)
        finally:
            entry = steps[(kind, bucket(rows))]
            entry["seconds"] += timers.clock() - t0
            entry["calls"] += 1
            entry["rows"] += rows
            entry["context"] += sum(getattr(meta, "seq_lens", ()))
            for k in INNER:
                entry[k] += timers.seconds.get(k, 0.0) - before[k]
    model.forward = filed


def report_forwards(steps: dict, runs: int) -> None:
    print(f"\n{'forward passes':<22}{'s/run':>7}{'calls':>7}{'ms/call':>9}{'rows':>7}{'ctx/seq':>8}"
          + "".join(f"{k + ' ms':>13}" for k in INNER))
    order = sorted(steps, key=lambda kb: (kb[0], int(kb[1].lstrip(">").split("-")[0])))
    for kind, b in order:
        e = steps[(kind, b)]
        calls, per = e["calls"], 1e3 / e["calls"]
        seqs = e["rows"] if kind != "prefill" else calls   # decode: a row a sequence
        print(f"{kind + ' ' + b:<22}{e['seconds'] / runs:>7.3f}{int(calls) // runs:>7}{e['seconds'] * per:>9.2f}"
              f"{e['rows'] / calls:>7.1f}{e['context'] / seqs:>8.0f}" + "".join(f"{e[k] * per:>13.2f}" for k in INNER))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2, help="timed runs after the warm-up (figures are per run)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--per-op", action="store_true",
                    help="turn the fused decode layers off, so that decode steps show their parts too")
    args, engine_argv = ap.parse_known_args(argv)

    from gpu_worker.llm import LLM
    from gpu_worker.sampling_params import SamplingParams

    llm = LLM(**engine_options(args.model, engine_argv))
    engine = llm.engine
    if args.per_op:
        engine.model.fused_decode = None
    items = mixed_workload(args.requests)
    prompts = [w.prompt_token_ids for w in items]
    params = [SamplingParams(temperature=0, max_tokens=w.max_tokens, ignore_eos=True) for w in items]
    llm.generate(prompts, params)                    # warm-up: the same workload, untimed
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    untimed = time.perf_counter() - t0

    timers = Timers()
    steps: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    file_forwards(engine.model, timers, steps)       # inside instrument's "forward" timer
    instrument(engine, timers)
    if getattr(engine.model, "greedy_head", None) is not None:
        engine.model.greedy_tokens = timers.wrap("greedy head", engine.model.greedy_tokens)
    with timers.running():
        t0 = time.perf_counter()
        for _ in range(args.runs):
            llm.generate(prompts, params)
        timed = time.perf_counter() - t0
    n = args.runs
    s = add_others({k: v / n for k, v in timers.seconds.items()})
    tokens = sum(len(p) for p in prompts), sum(w.max_tokens for w in items)
    print(f"workload: {len(items)} requests, {tokens[0]} prompt + {tokens[1]} output tokens; "
          f"untimed run {untimed:.2f} s, timed runs {timed / n:.2f} s each")
    print("seconds per run")
    for part in (*PARTS, "greedy head"):
        if part in s:
            print(f"{part:<22}{s[part]:>10.3f}")
    report_forwards(steps, n)


if __name__ == "__main__":
    main()
