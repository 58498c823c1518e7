"""``fleet bench edge``: what the Redis edge costs per streamed token, and what cuts it.

A synthetic engine (no model: ``--seqs`` requests decoding one token every ``--step-ms``,
as a GPU would) runs inside the real worker (its own process), talking to real Redis;
real clients (this process) keep requests in flight, each subscribed to its channel
before it is enqueued, and check every event (exactly once, in order, the right tokens,
the right result). Measured over a window of ``--seconds`` after ``--warmup-s``: Redis
server CPU seconds (INFO cpu, user + sys, summed over every node) per 1,000 tokens
delivered (also less what the idle servers use: cron, and gossip on a cluster, measured
before the first run), the worker's and the clients' CPU per 1,000 tokens, the tokens/s
delivered against the engine's rate, token events per token, and how late tokens reach
the client.

Side by side, interleaved run by run (the machine's load drifts): a single server and a
Redis Cluster of ``--cluster-nodes`` masters, both started here on loopback ports; for
each, the scripts as they were before the cuts (``baseline``, interval 0) and as they are
at each ``--intervals`` (``stream_interval_ms``). ``--saturate-seqs`` adds a load well
beyond what the edge can carry on this machine: what it then delivers is what it
sustains. The JSON report holds every run and the ratios; the exit code is 1 if any
client saw anything wrong.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from gpu_worker.bench.edge_redis import Servers
from gpu_worker.bench.edge_run import Run, Topology, measure
from gpu_worker.bench.edge_scripts import publish_cost
from kernels import cpuinfo

logger = logging.getLogger(__name__)

_SUMMED = ("redis_cpu_s_per_1k_tokens", "redis_cpu_s_per_1k_tokens_above_idle",
           "worker_cpu_s_per_1k_tokens", "client_cpu_s_per_1k_tokens",
           "offered_tok_s", "delivered_tok_s", "events_per_token", "token_age_ms_p50",
           "token_age_ms_p99", "redis_cpu_share", "redis_cpu_system_fraction")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=4.0, help="measured window of each run")
    p.add_argument("--warmup-s", type=float, default=1.0, help="before each window")
    p.add_argument("--seqs", type=int, default=64, help="sequences decoding at once")
    p.add_argument("--step-ms", type=float, default=20.0, help="the engine's step time")
    p.add_argument("--saturate-seqs", type=int, default=0,
                   help="also run this many sequences (0: no saturated load)")
    p.add_argument("--saturate-step-ms", type=float, default=10.0)
    p.add_argument("--saturate-intervals", default="0,50",
                   help="stream_interval_ms values at the saturated load (after the baseline)")
    p.add_argument("--tokens-per-step", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=100, help="tokens per request")
    p.add_argument("--intervals", default="0,20,50", help="stream_interval_ms values measured")
    p.add_argument("--topologies", default="single,cluster")
    p.add_argument("--cluster-nodes", type=int, default=3)
    p.add_argument("--no-baseline", action="store_true", help="skip the pre-cut scripts")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the steady load, interleaved")
    p.add_argument("--idle-s", type=float, default=2.0, help="idle servers' CPU, measured first")
    p.add_argument("--script-rounds", type=int, default=60,
                   help="rounds of the PUBLISH script alone, per variant (0: skip)")
    p.add_argument("--json", type=Path, default=None, help="write the report here")


def plan(args) -> list[Run]:
    """Every run, in the order measured: rounds of the steady load, then the saturated one
    (once); within a round each variant in turn (topologies alternate inside ``_run_all``)."""
    def variants(intervals: str) -> list[tuple[str, int]]:
        return ([] if args.no_baseline else [("baseline", 0)]) + [
            ("cut", int(x)) for x in intervals.split(",") if x != ""]

    runs = [Run("steady", args.seqs, args.step_ms, v, i) for _ in range(args.repeats)
            for v, i in variants(args.intervals)]
    if args.saturate_seqs:
        runs += [Run("saturated", args.saturate_seqs, args.saturate_step_ms, v, i)
                 for v, i in variants(args.saturate_intervals)]
    return runs


async def _run_all(args, workdir: Path) -> tuple[list[dict], dict]:
    """Every run's figures; and what was measured on the servers alone (idle CPU, the
    PUBLISH script's own cost)."""
    topologies: list[Topology] = []
    try:
        for name in [t for t in args.topologies.split(",") if t]:
            cluster = name == "cluster"
            servers = Servers(cluster=cluster, nodes=args.cluster_nodes if cluster else 1)
            topologies.append(Topology(name, servers.start()))
        scripts = {}
        for topo in topologies:
            await topo.measure_idle(args.idle_s)
            if args.script_rounds:
                scripts[topo.name] = publish_cost(topo.admin, topo.slot_owner,
                                                  cluster=topo.servers.cluster,
                                                  rounds=args.script_rounds)
        results = []
        for run in plan(args):
            for topo in topologies:
                result = await measure(args, topo, run, workdir)
                logger.info("%s %s %s: %.5f Redis CPU s / 1k tokens, %.0f tok/s, correct %s",
                            topo.name, run.load, run.name, result["redis_cpu_s_per_1k_tokens"],
                            result["delivered_tok_s"], result["correct"])
                results.append(result)
        idle = {topo.name: round(topo.idle_cpu_share, 5) for topo in topologies}
        return results, {"redis_idle_cpu_share": idle, "publish_script_server_us_per_call": scripts}
    finally:
        for topo in topologies:
            topo.servers.stop()


def summarize(results: list[dict]) -> dict:
    """load -> topology -> variant: the mean of its rounds, its Redis CPU relative to the
    baseline's, and tokens per Redis CPU second; per load, cluster over single."""
    table: dict = {}
    for r in results:
        name = Run(r["load"], 0, 0, r["variant"], r["stream_interval_ms"]).name
        table.setdefault(r["load"], {}).setdefault(r["topology"], {}).setdefault(name, []).append(r)
    out: dict = {}
    for load, topologies in table.items():
        out[load] = {}
        for topo, variants in topologies.items():
            rows = {name: _row(rs) for name, rs in variants.items()}
            base = rows.get("baseline")
            for row in rows.values():
                if base and base["redis_cpu_s_per_1k_tokens"]:
                    row["redis_cpu_vs_baseline"] = round(
                        row["redis_cpu_s_per_1k_tokens"] / base["redis_cpu_s_per_1k_tokens"], 3)
            out[load][topo] = rows
        single, cluster = topologies.get("single"), topologies.get("cluster")
        if single and cluster:
            out[load]["cluster_over_single"] = {
                name: round(out[load]["cluster"][name]["redis_cpu_s_per_1k_tokens"]
                            / out[load]["single"][name]["redis_cpu_s_per_1k_tokens"], 3)
                for name in out[load]["cluster"] if name in out[load]["single"]}
    return out


def _row(rs: list[dict]) -> dict:
    row = {k: _mean([r[k] for r in rs]) for k in _SUMMED}
    cpu = row["redis_cpu_s_per_1k_tokens"]
    row["tokens_per_redis_cpu_s"] = round(1000 / cpu) if cpu else None
    row["rounds"] = len(rs)
    row["correct"] = all(r["correct"] for r in rs)
    return row


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 5) if values else None


def _machine() -> dict:
    return {"cpu": cpuinfo.model_name(), "cores": os.cpu_count(), "load_avg_before": _load()}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> int:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    machine = _machine()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-edge-") as tmp:
        results, alone = asyncio.run(_run_all(args, Path(tmp)))
    machine["load_avg_after"] = _load()
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if not k.startswith("_") and k not in ("json", "command", "subcommand")}
    report = {"machine": machine, "date": started, "config": config,
              **alone, "summary": summarize(results), "runs": results}
    sys.stdout.write(json.dumps({k: report[k] for k in ("publish_script_server_us_per_call",
                                                        "redis_idle_cpu_share", "summary")},
                                indent=2) + "\n")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not all(r["correct"] for r in results):
        logger.error("a client saw a token lost, repeated, out of order or wrong")
        return 1
    return 0
