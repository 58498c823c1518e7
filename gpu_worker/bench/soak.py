"""``fleet bench soak``: the fleet under faults, every token event counted by ``seq``.

Starts its own ``redis-server`` (AOF, ``appendfsync always``: a ``kill -9`` loses no
acknowledged write) on a free loopback port and ``--workers`` real ``fleet worker``
processes; drives valid requests through the client library and raw invalid entries beside
them for ``--minutes``; injects ``kill -9`` of workers, SIGSTOP/SIGCONT and Redis restarts
on a seeded schedule; then lets the fleet settle and closes the books. Valid answers are
checked against a reference computed once in-process with the engine (greedy, fixed
lengths). The JSON report and a short summary say what was served, what was injected, and
whether any token was lost, repeated or reordered; the exit code is 1 if any invariant
broke. Every process it starts is killed on the way out, also on Ctrl-C.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from gpu_worker.bench.soak_faults import FAULT_KINDS, FaultInjector, fault_schedule, supervise
from gpu_worker.bench.soak_ledger import ChannelListener
from gpu_worker.bench.soak_procs import RedisProcess, WorkerPool, tail
from gpu_worker.bench.soak_report import (invalid_figures, invariants, redis_end_state, summary,
                                          valid_figures)
from gpu_worker.bench.soak_traffic import Gate, Traffic
from kernels import cpuinfo

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=5.0, help="how long traffic and faults run")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument("--seed", type=int, default=0, help="seeds the traffic and the fault schedule")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--model", default=None, help="HF dir or .gguf; 'default': the embedded "
                   "SmolLM2 (default: a tiny random-weight model, fast)")
    p.add_argument("--kv-cache-memory", default=None, help="per worker (default 8MiB for the "
                   "tiny model, 256MiB otherwise)")
    p.add_argument("--fault-interval-s", type=float, default=10.0, help="mean time between faults")
    p.add_argument("--faults", default=",".join(FAULT_KINDS), help="fault kinds ('' for none)")
    p.add_argument("--invalid-share", type=float, default=0.1,
                   help="share of entries that are invalid (0: valid traffic only)")
    p.add_argument("--concurrency", type=int, default=None, help="valid requests in flight "
                   "(default: 2 per worker)")
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts")
    p.add_argument("--min-tokens", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-deliveries", type=int, default=10, help="the workers' poison limit")
    p.add_argument("--request-timeout-s", type=float, default=120.0)
    p.add_argument("--settle-s", type=float, default=60.0,
                   help="after the traffic stops, how long requests may take to finish")
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep the Redis AOF and worker logs here (default: a temporary dir)")


def make_prompts(seed: int, count: int) -> list[list[int]]:
    """Token-id prompts (ids below 1000, valid for any model here); half share a prefix,
    so prefix caching is exercised across workers' resumes too."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 1000) for _ in range(16)]
    return [(prefix if i % 2 == 0 else []) + [rng.randrange(10, 1000)
                                            for _ in range(rng.randint(4, 40))]
            for i in range(count)]


def compute_reference(model: str | None, prompts: list[list[int]], max_tokens: int,
                      kv_bytes: int) -> list[list[int]]:
    """Greedy outputs of every prompt, in-process: each valid answer must be a prefix."""
    from gpu_worker import LLM, SamplingParams

    llm = LLM(model, kv_cache_memory=kv_bytes, num_threads=1)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params)]


def machine() -> dict:
    return {"cpu": cpuinfo.model_name(), "cores": os.cpu_count()}


def _model(args, workdir: Path) -> str | None:
    if args.model == "default":
        return None
    if args.model is not None:
        return args.model
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(workdir / "tiny-llama")


def _kv_memory(args) -> str:
    return args.kv_cache_memory or ("8MiB" if args.model is None else "256MiB")


def _worker_flags(args, model: str | None) -> list[str]:
    ttl_s = int(args.minutes * 60 + args.settle_s + 600)  # results outlive the run
    flags = ["--kv-cache-memory", _kv_memory(args), "--claim-idle-ms", "1500",
             "--heartbeat-s", "0.3", "--block-ms", "200", "--drain-grace-s", "5",
             "--max-deliveries", str(args.max_deliveries), "--result-ttl-s", str(ttl_s),
             "--threads", "1"]
    return flags + ([] if model is None else ["--model", model])


def _wait_ready(pool: WorkerPool, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        pool.refresh_ready()
        if all(w.ready for w in pool.current.values()):
            return
        for w in pool.current.values():
            if w.proc.poll() is not None:
                raise RuntimeError(f"worker {w.worker_id} exited during start-up:\n"
                                   + "\n".join(tail(w.log)))
        if time.monotonic() > deadline:
            raise RuntimeError("workers not ready in time")
        time.sleep(0.2)


async def _drive(args, redis_proc: RedisProcess, pool: WorkerPool, prompts, reference) -> dict:
    duration_s = args.minutes * 60.0
    gate, listener = Gate(), ChannelListener(redis_proc.url)
    listening = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.subscribed.wait(), 10)
    traffic = Traffic(redis_proc.url, gate, listener, prompts, seed=args.seed,
                      concurrency=args.concurrency or 2 * args.workers,
                      invalid_share=args.invalid_share,
                      max_tokens=(args.min_tokens, args.max_tokens),
                      request_timeout_s=args.request_timeout_s)
    injector = FaultInjector(pool, redis_proc, gate, traffic, seed=args.seed)
    kinds = tuple(k for k in args.faults.split(",") if k)
    schedule = fault_schedule(args.seed, duration_s, args.fault_interval_s, kinds)
    started, exits = time.monotonic(), []
    background = [listening, asyncio.create_task(supervise(pool, started, exits))]
    faults = asyncio.create_task(injector.run(schedule, started))
    try:
        await traffic.run(started + duration_s)
        await faults
        unfinished = await traffic.finish(args.settle_s)
        end = await redis_end_state(redis_proc.url, timeout_s=30.0)
        await asyncio.sleep(0.5)  # the channel's last messages
        elapsed = time.monotonic() - started
    finally:
        for task in [*background, faults]:
            task.cancel()
        await asyncio.gather(*background, faults, return_exceptions=True)
        await traffic.close()
        await listener.close()
    dead_ids = end.pop("dead_entry_ids")
    return _books(args, elapsed, traffic, listener, reference, injector, exits,
                  {**end, "unfinished_tasks": unfinished}, dead_ids)


def _books(args, elapsed, traffic, listener, reference, injector, exits, end, dead_ids) -> dict:
    valid = valid_figures(traffic, listener, reference)
    recoveries = [f.recovery_s for f in injector.faults if f.recovery_s is not None]
    report = {
        "machine": machine(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(elapsed, 1), "minutes": args.minutes, "seed": args.seed,
        "workers": args.workers, "model": args.model or "tiny-random",
        "invalid_share": args.invalid_share, "fault_interval_s": args.fault_interval_s,
        "valid": valid, "invalid": invalid_figures(traffic, listener, dead_ids),
        "faults_by_kind": dict(Counter(f.kind for f in injector.faults)),
        "faults_skipped": dict(injector.skipped), "faults": [asdict(f) for f in injector.faults],
        "max_recovery_s": max(recoveries, default=None),
        "tokens": {"lost": valid["client"]["lost"], "repeated": valid["client"]["repeated"],
                   "repeated_on_channel": valid["channel"]["repeated"],
                   "out_of_order": valid["client"]["out_of_order"],
                   "out_of_order_on_channel": valid["channel"]["out_of_order"]},
        "worker_exits_unexplained": exits, "end": end,
    }
    report["invariants"] = invariants(report)
    report["ok"] = all(report["invariants"].values())
    return report


def soak(args, workdir: Path) -> dict:
    """The whole run; every process it started is gone when it returns or raises."""
    model = _model(args, workdir)
    redis_proc = RedisProcess(workdir)
    pool = WorkerPool(redis_proc.url, workdir, _worker_flags(args, model), args.workers)
    try:
        redis_proc.start()
        pool.start_all()  # they load their model while the reference is computed here
        from gpu_worker.config import parse_bytes

        prompts = make_prompts(args.seed, args.prompts)
        reference = compute_reference(model, prompts, args.max_tokens,
                                      parse_bytes(_kv_memory(args)))
        _wait_ready(pool, timeout_s=300)
        report = asyncio.run(_drive(args, redis_proc, pool, prompts, reference))
        report["end"]["worker_exit_codes_at_stop"] = pool.terminate(grace_s=15)
        return report
    finally:
        pool.close()
        redis_proc.kill()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _interrupt)  # clean up on SIGTERM as on Ctrl-C
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            report = soak(args, args.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="fleet-soak-") as tmp:
                report = soak(args, Path(tmp))
    except KeyboardInterrupt:
        logger.warning("soak interrupted; every process it started is stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    text = json.dumps(report, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(summary(report))
    return 0 if report["ok"] else 1
