"""One run of ``fleet bench edge``: a fresh worker process (the synthetic engine) on a
fresh model namespace, clients keeping it full, figures over a measured window."""
from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from gpu_worker.bench.edge_clients import Books, Traffic
from gpu_worker.bench.edge_redis import Servers, command_stats, cpu_seconds, cpu_split
from gpu_worker.bench.soak_procs import child_env, tail
from shared import keys


@dataclass(frozen=True)
class Run:
    """What one run measures: a load (``seqs`` decoding, one step every ``step_ms``) and a
    variant of the edge (``baseline``: the scripts before the cuts) at an interval."""

    load: str
    seqs: int
    step_ms: float
    variant: str
    interval_ms: int

    @property
    def name(self) -> str:
        return "baseline" if self.variant == "baseline" else f"cut-{self.interval_ms}ms"


class Topology:
    """The servers of one topology, an admin client per node, and a client for keys."""

    def __init__(self, name: str, servers: Servers) -> None:
        self.name, self.servers = name, servers
        self.admin = servers.clients()
        self.client = redis.RedisCluster.from_url(servers.url) if servers.cluster else self.admin[0]
        share = 16384 // len(servers.ports)
        last = len(servers.ports) - 1
        self.slot_owner = (lambda slot: min(slot // share, last)) if servers.cluster else (lambda slot: 0)
        self.idle_cpu_share = 0.0

    async def measure_idle(self, seconds: float) -> None:
        """The servers' own CPU with no traffic (cron; gossip on a cluster), per second."""
        t0, c0 = time.monotonic(), cpu_seconds(self.admin)
        await asyncio.sleep(seconds)
        self.idle_cpu_share = (cpu_seconds(self.admin) - c0) / (time.monotonic() - t0)


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _start_worker(args, topo: Topology, run: Run, model: str, log: Path):
    worker_id = f"bench-{uuid.uuid4().hex[:6]}"
    config = {"redis_url": topo.servers.url, "model_name": model, "worker_id": worker_id,
              "seqs": run.seqs, "step_ms": run.step_ms, "tokens_per_step": args.tokens_per_step,
              "local_queue": max(8, run.seqs // 8), "stream_interval_ms": run.interval_ms,
              "baseline": run.variant == "baseline"}
    proc = subprocess.Popen([sys.executable, "-m", "gpu_worker.bench.edge_worker", json.dumps(config)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=child_env())
    return proc, keys.worker_key(model, worker_id)


async def _wait_ready(topo: Topology, proc, heartbeat: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while not topo.client.exists(heartbeat):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the bench worker did not start:\n" + "\n".join(tail(log)))
        await asyncio.sleep(0.05)


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)  # drains, as a real worker
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


async def measure(args, topo: Topology, run: Run, workdir: Path) -> dict:
    model = f"bench-{uuid.uuid4().hex[:8]}"
    log = workdir / f"{topo.name}-{run.load}-{run.name}-{model}.log"
    proc, heartbeat = _start_worker(args, topo, run, model, log)
    # more in flight than the engine runs, so it stays full while finished ones are replaced
    traffic = Traffic(topo.servers.ports, topo.slot_owner, model=model,
                      concurrency=run.seqs + max(8, run.seqs // 4), max_tokens=args.max_tokens,
                      cluster=topo.servers.cluster)
    try:
        await _wait_ready(topo, proc, heartbeat, log)
        await traffic.start()
        await asyncio.sleep(args.warmup_s)
        commands = command_stats(topo.admin)
        split = cpu_split(topo.admin)
        before = (time.monotonic(), sum(split), _proc_cpu(proc.pid), _self_cpu())
        traffic.books.in_window = True
        await asyncio.sleep(args.seconds)
        traffic.books.in_window = False
        after = (time.monotonic(), cpu_seconds(topo.admin), _proc_cpu(proc.pid), _self_cpu())
        split = [b - a for a, b in zip(split, cpu_split(topo.admin))]
        commands = _per_1k(commands, command_stats(topo.admin), traffic.books.window_tokens)
        finished = await traffic.finish(timeout=60 + args.max_tokens * run.step_ms / 1000)
    finally:
        _stop(proc)
        await traffic.close()
    figures = _figures(args, topo, run, traffic.books, before, after, finished)
    figures["redis_cpu_system_fraction"] = round(split[1] / max(sum(split), 1e-9), 3)
    figures["commands_per_1k_tokens"] = commands
    return figures


def _per_1k(before: dict, after: dict, tokens: int) -> dict[str, dict]:
    """Calls and server microseconds per 1,000 tokens, per command, most costly first
    (microseconds are wall time inside the command: inflated when the cores are busy)."""
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls > c0:
            out[name] = {"calls": round(1000 * (calls - c0) / max(tokens, 1), 1),
                         "usec": round(1000 * (usec - u0) / max(tokens, 1))}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["usec"]))


def _pct(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(int(q * (len(ordered) - 1) + 0.5), len(ordered) - 1)])


def _figures(args, topo: Topology, run: Run, books: Books, before, after, finished) -> dict:
    wall, redis_cpu, worker_cpu, client_cpu = (a - b for a, b in zip(after, before))
    tokens = max(books.window_tokens, 1)
    return {
        "topology": topo.name, "load": run.load, "seqs": run.seqs, "step_ms": run.step_ms,
        "variant": run.variant, "stream_interval_ms": run.interval_ms,
        "window_s": round(wall, 3), "tokens": books.window_tokens, "events": books.window_events,
        "events_per_token": round(books.window_events / tokens, 4),
        "offered_tok_s": round(run.seqs * args.tokens_per_step / (run.step_ms / 1000.0), 1),
        "delivered_tok_s": round(books.window_tokens / wall, 1),
        "redis_cpu_s_per_1k_tokens": round(1000 * redis_cpu / tokens, 5),
        "redis_cpu_share": round(redis_cpu / wall, 4),
        "redis_cpu_s_per_1k_tokens_above_idle": round(
            1000 * (redis_cpu - topo.idle_cpu_share * wall) / tokens, 5),
        "worker_cpu_s_per_1k_tokens": round(1000 * worker_cpu / tokens, 5),
        "client_cpu_s_per_1k_tokens": round(1000 * client_cpu / tokens, 5),
        "token_age_ms_p50": _pct(books.ages_ms, 0.5), "token_age_ms_p99": _pct(books.ages_ms, 0.99),
        "requests_done": books.requests_done, "all_finished": finished,
        "repeated": books.repeated, "gaps": books.gaps, "differing": books.differing,
        "bad_results": books.bad_results, "correct": books.correct and finished,
    }
