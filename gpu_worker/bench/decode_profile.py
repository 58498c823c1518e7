"""Where a small-batch decode step's time goes, part by part (ms per step).

    python -m gpu_worker.bench.decode_profile --batch 1 4 [--per-op] [--quantization int8]

Runs the real engine (embedded SmolLM2 by default, greedy, fp32, OMP threads spinning as in
production) on ``batch`` requests of 32-token prompts, prefills them, then times decode
steps with ``perf_counter`` around the parts of ``EngineCore.step``: schedule, batch
preparation, attention planning, the forward pass split into matmuls (every projection),
attention, glue (RMSNorm, RoPE, SiLU-and-mul) and the rest (embedding, views, Python), the LM
head, sampling and the update (detokenization shown apart). Each timer costs about a
microsecond per call (~130 per step), so the parts sum to a little more than an untimed step;
the untimed step time (mean and median) is measured too, on the same engine, alternating
with timed steps. Decode steps run the fused C layers (``model/ops/cpu_fused.py``) when the
model has them, which leaves the parts inside the forward pass untimed ("forward other");
``--per-op`` turns them off, so that the breakdown shows the per-op path.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

from gpu_worker.config import EngineConfig
from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.engine import EngineCore
from gpu_worker.sampling_params import SamplingParams

PROMPT_LEN = 32
PARTS = ("schedule", "prepare", "plan", "matmul", "attention", "glue", "forward other", "lm head",
         "sample", "detokenize", "update other", "step other")


class Timers:
    """Accumulated seconds per named part; ``wrap`` times a callable under a name while on."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False
        self.clock = clock

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += self.clock() - t0
        return timed

    @contextmanager
    def running(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False


def instrument(engine: EngineCore, timers: Timers) -> None:
    """Put timers around the parts of one engine's step (instance attributes, except the
    detokenizer's ``push``, which is patched for the process)."""
    sched, runner, model = engine.scheduler, engine.runner, engine.model
    sched.schedule = timers.wrap("schedule", sched.schedule)
    runner.prepare = timers.wrap("prepare", runner.prepare)
    runner.sample = timers.wrap("sample", runner.sample)
    sched.update_from_output = timers.wrap("update", sched.update_from_output)
    model.compute_logits = timers.wrap("lm head", model.compute_logits)
    ops = model.ops
    model.ops = dataclasses.replace(
        ops, plan_attention=timers.wrap("plan", ops.plan_attention), attention=timers.wrap("attention", ops.attention),
        add_rms_norm=timers.wrap("glue", ops.add_rms_norm), rope=timers.wrap("glue", ops.rope),
        prepare_rope=timers.wrap("glue", ops.prepare_rope), silu_and_mul=timers.wrap("glue", ops.silu_and_mul),
        gated_mlp=timers.wrap("matmul", ops.gated_mlp))
    model.forward = timers.wrap("forward", model.forward)
    for layer in model.layers:   # gate_up: inside gated_mlp, timed with it (its activation too)
        for m in (layer.qkv, layer.o_proj, layer.down):
            m.forward = timers.wrap("matmul", m.forward)
    IncrementalDetokenizer.push = timers.wrap("detokenize", IncrementalDetokenizer.push)


def profile(engine: EngineCore, timers: Timers, batch: int, steps: int) -> dict[str, float]:
    """ms per decode step for each part (and "step" timed, "untimed step" without timers)."""
    params = SamplingParams(temperature=0, max_tokens=2 * steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"p{batch}-{i}", [1000 + i + j for j in range(PROMPT_LEN)], params)
    engine.step()                                  # the prefill
    for _ in range(4):
        engine.step()                              # warm-up decodes
    timers.seconds.clear()
    timed, untimed, clock = 0.0, [], timers.clock
    for _ in range(steps):                         # alternate timed and untimed steps
        with timers.running():
            t0 = clock()
            engine.step()
            timed += clock() - t0
        t0 = clock()
        engine.step()
        untimed.append(clock() - t0)
    while engine.has_unfinished_requests():
        engine.step()
    return _breakdown(timers.seconds, timed, untimed, steps)


# The parts timed inside the forward pass (per-op steps only; "plan" runs before it).
INNER = ("matmul", "attention", "glue")


def add_others(parts: dict[str, float]) -> dict[str, float]:
    """``parts`` with "forward other" and "update other": what those timers leave after the
    timed parts inside them (in the parts' own unit)."""
    parts["forward other"] = parts.get("forward", 0.0) - sum(parts.get(k, 0.0) for k in INNER)
    parts["update other"] = parts.get("update", 0.0) - parts.get("detokenize", 0.0)
    return parts


def _breakdown(s: dict[str, float], timed: float, untimed: list[float], steps: int) -> dict[str, float]:
    """The parts as ms per step (``add_others``), and "step other", what the whole step leaves."""
    ms = add_others({k: v * 1e3 / steps for k, v in s.items()})
    ms["step"], ms["untimed step"] = timed * 1e3 / steps, sum(untimed) * 1e3 / steps
    ms["untimed median"] = statistics.median(untimed) * 1e3
    top = ("schedule", "prepare", "plan", "forward", "lm head", "sample", "update")
    ms["step other"] = ms["step"] - sum(ms.get(k, 0.0) for k in top)
    return ms


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=48, help="timed decode steps per batch size")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the thread's CPU clock, not the wall clock: with --threads 1 it leaves out "
                         "the time other processes take the core (a loaded machine)")
    ap.add_argument("--per-op", action="store_true", help="turn the fused decode layers off (the per-op path)")
    ap.add_argument("--quantization", default=None, help="a --quantization spec (default: none, fp32)")
    args = ap.parse_args(argv)
    engine = EngineCore(EngineConfig(model=args.model, num_threads=args.threads, quantization=args.quantization))
    if args.per_op:
        engine.model.fused_decode = None
    timers = Timers(time.thread_time if args.cpu_time else time.perf_counter)
    instrument(engine, timers)
    results = {b: profile(engine, timers, b, args.steps) for b in args.batch}
    print(f"{'ms per decode step':<22}" + "".join(f"{f'batch {b}':>10}" for b in args.batch))
    for part in (*PARTS, "step", "untimed step", "untimed median"):
        print(f"{part:<22}" + "".join(f"{results[b].get(part, 0.0):>10.2f}" for b in args.batch))
    nonmm = {b: r["step"] - r.get("matmul", 0.0) - r.get("lm head", 0.0) for b, r in results.items()}
    print(f"{'non-matmul (timed)':<22}" + "".join(f"{nonmm[b]:>10.2f}" for b in args.batch))


if __name__ == "__main__":
    main()
