"""``fleet bench e2e``: the mixed workload through Redis vs the in-process engine.

Same workload, same engine options, one run: first the in-process engine (all requests
added at once; then one at a time for low-load TTFT), then one ``fleet worker`` process fed
through Redis by a separate client process (``producer.loadgen``) doing the same.
Reports ``e2e_tok_s``, ``engine_tok_s`` and TTFT p50/p99 at low load for both (the
``*_loaded`` keys: TTFT with every request submitted at once).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from gpu_worker.edge.cli import add_engine_arguments, default_redis_url, engine_config

logger = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    """Child processes import this checkout (also when it is not pip-installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH")) if p)
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--low-load", type=int, default=8, help="requests for low-load TTFT")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--redis-url", default=default_redis_url(),
                        help="used if it answers, else a redis-server is started")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)] * 1000.0


def _engine_run(engine, items, max_tokens=None) -> tuple[list[float], int, float]:
    from gpu_worker.sampling_params import SamplingParams

    t0 = time.perf_counter()
    first: dict[str, float] = {}
    for i, item in enumerate(items):
        n = max_tokens or item.max_tokens
        engine.add_request(f"b{i}-{uuid.uuid4().hex[:6]}", item.prompt_token_ids,
                           SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    tokens = 0
    while engine.has_unfinished_requests():
        for delta in engine.step():
            tokens += len(delta.new_token_ids)
            if delta.new_token_ids:
                first.setdefault(delta.request_id, time.perf_counter() - t0)
    return list(first.values()), tokens, time.perf_counter() - t0


def measure_engine(args, items) -> dict:
    """Created here, stepped in a dedicated thread, as in the worker. (Measured with torch
    2.13 on this CPU: stepping from the thread that built the engine was 7-15x slower.)"""
    from gpu_worker.engine import EngineCore

    engine = EngineCore(engine_config(args))
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(_measure(engine, args, items)))
    thread.start()
    thread.join()
    engine = None  # drop the model before the next measurement
    gc.collect()
    return out


def _measure(engine, args, items) -> dict:
    _engine_run(engine, items[:1], max_tokens=2)  # warm-up
    low = [_engine_run(engine, [item], max_tokens=2)[0][0] for item in items[:args.low_load]]
    loaded, tokens, wall = _engine_run(engine, items)
    return {"ttft_low_load_s": low, "ttft_loaded_s": loaded, "output_tokens": tokens,
            "wall_s": wall}


def _worker_cmd(args, url: str, model_name: str) -> list[str]:
    cmd = [sys.executable, "-m", "gpu_worker.cli", "worker", "--redis-url", url,
           "--model-name", model_name, "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--block-size", str(args.block_size), "--local-queue", "8"]
    for flag, value in (("--model", args.model), ("--kv-cache-memory", args.kv_cache_memory),
                        ("--threads", args.threads)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


@contextlib.contextmanager
def worker_process(args, url: str, model_name: str, log_path: Path):
    """One ``fleet worker`` process on ``url``, yielded once it has registered; stopped after."""
    import redis

    from shared import keys

    with open(log_path, "w") as log:
        worker = subprocess.Popen(_worker_cmd(args, url, model_name), stdout=log,
                                  stderr=subprocess.STDOUT, env=_env())
        try:
            client = redis.Redis.from_url(url)
            while not client.zcard(keys.workers_key(model_name)):
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited; see {log_path}")
                time.sleep(0.1)
            yield worker
        finally:
            worker.terminate()
            worker.wait(60)


def measure_e2e(args, items, tmp: Path) -> dict:
    from shared.local_redis import redis_url_or_local

    workload = tmp / "workload.jsonl"
    workload.write_text("".join(json.dumps({"prompt_token_ids": x.prompt_token_ids,
                                            "max_tokens": x.max_tokens}) + "\n" for x in items))
    model_name = f"bench-{uuid.uuid4().hex[:8]}"
    with redis_url_or_local(args.redis_url) as url, worker_process(args, url, model_name, tmp / "worker.log"):
        out = tmp / "client.json"
        subprocess.run([sys.executable, "-m", "producer.loadgen", "--redis-url", url,
                        "--model-name", model_name, "--workload", str(workload),
                        "--out", str(out), "--low-load", str(args.low_load)], check=True, env=_env())
        return json.loads(out.read_text())


def run(args: argparse.Namespace) -> int:
    from gpu_worker.bench.workload import mixed_workload

    items = mixed_workload(args.requests, seed=args.seed)
    engine = measure_engine(args, items)
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        e2e = measure_e2e(args, items, Path(tmp))
    report = {"requests": args.requests, "seed": args.seed, "output_tokens": engine["output_tokens"],
              "engine_tok_s": engine["output_tokens"] / engine["wall_s"],
              "e2e_tok_s": e2e["output_tokens"] / e2e["wall_s"]}
    for name, m in (("engine", engine), ("e2e", e2e)):
        for suffix, ttfts in (("", m["ttft_low_load_s"]), ("_loaded", m["ttft_loaded_s"])):
            report[f"ttft_p50_ms_{name}{suffix}"] = _pct(ttfts, 0.5)
            report[f"ttft_p99_ms_{name}{suffix}"] = _pct(ttfts, 0.99)
    report["e2e_over_engine"] = report["e2e_tok_s"] / report["engine_tok_s"]
    report["ttft_p50_overhead_ms"] = report["ttft_p50_ms_e2e"] - report["ttft_p50_ms_engine"]
    text = json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()},
                      indent=2)
    sys.stdout.write(text + "\n")
    if args.json:
        Path(args.json).write_text(text + "\n")
    ok = report["e2e_over_engine"] >= 0.95 and report["ttft_p50_overhead_ms"] <= 5.0
    logger.info("targets (e2e >= 0.95x engine, p50 TTFT +<= 5 ms): %s", "met" if ok else "MISSED")
    return 0
