"""TTFT and inter-token latency through Redis beside the in-process engine, same workload.

    python -m gpu_worker.bench.latency --requests 24 --interval-ms 250 --repeats 2 \\
        --json docs/bench/latency.json          # the picture beside it: latency.png

Requests arrive on a fixed schedule (one every ``--interval-ms``), the same for both sides,
which take turns ``--repeats`` times: the engine in this process (stepped in its own
thread, as in the worker, requests added when due), then one real ``fleet worker`` process
on a redis-server fed by a client process (``latency_client``) that records when each
token arrives. Greedy, ``ignore_eos``,
fixed output lengths. The JSON and the picture carry the CPU, the date and the load.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from gpu_worker.bench.latency_client import per_request
from gpu_worker.bench.pictures import machine, pyplot
from gpu_worker.edge.bench_e2e import _env, worker_process
from gpu_worker.edge.cli import add_engine_arguments, default_redis_url, engine_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval-ms", type=float, default=250.0, help="one arrival every N ms")
    parser.add_argument("--repeats", type=int, default=2, help="engine, Redis, engine, Redis, ...")
    parser.add_argument("--json", type=Path, default=None, help="write the report (and a .png beside it)")
    parser.add_argument("--redis-url", default=default_redis_url(),
                        help="used if it answers, else a redis-server is started")


def _step_engine(engine, items, interval_s: float) -> list[dict]:
    from gpu_worker.sampling_params import SamplingParams

    def add(rid, item, n):
        engine.add_request(rid, item.prompt_token_ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))

    add("warm", items[0], 2)
    while engine.has_unfinished_requests():
        engine.step()
    timed: dict[str, dict] = {}
    t0, nxt = time.perf_counter(), 0
    while nxt < len(items) or engine.has_unfinished_requests():
        while nxt < len(items) and time.perf_counter() >= t0 + nxt * interval_s:
            timed[f"r{nxt}"] = {"start": time.perf_counter(), "events": []}
            add(f"r{nxt}", items[nxt], items[nxt].max_tokens)
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, t0 + nxt * interval_s - time.perf_counter()))
            continue
        for delta in engine.step():
            if delta.new_token_ids and delta.request_id in timed:
                timed[delta.request_id]["events"].append((time.perf_counter(), len(delta.new_token_ids)))
    return list(timed.values())


def measure_engine(args, items) -> list[dict]:
    from gpu_worker.engine import EngineCore

    engine = EngineCore(engine_config(args))
    out: list[dict] = []
    thread = threading.Thread(target=lambda: out.extend(_step_engine(engine, items, args.interval_ms / 1000)))
    thread.start()
    thread.join()
    return out


def measure_redis(args, items, tmp: Path) -> list[dict]:
    from shared.local_redis import redis_url_or_local

    model_name = f"latency-{uuid.uuid4().hex[:8]}"
    with redis_url_or_local(args.redis_url) as url, worker_process(args, url, model_name, tmp / "worker.log"):
        spec = {"redis_url": url, "model_name": model_name, "interval_ms": args.interval_ms,
                "items": [{"prompt_token_ids": x.prompt_token_ids, "max_tokens": x.max_tokens} for x in items]}
        (tmp / "spec.json").write_text(json.dumps(spec))
        subprocess.run([sys.executable, "-m", "gpu_worker.bench.latency_client", str(tmp / "spec.json"),
                        str(tmp / "client.json")], check=True, env=_env())
        return json.loads((tmp / "client.json").read_text())["requests"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(q * (len(ordered) - 1))), len(ordered) - 1)] * 1000.0


def summarize(timed: list[dict]) -> dict:
    ttft, itl = [], []
    for r in timed:
        first, gaps = per_request(r["start"], [tuple(e) for e in r["events"]])
        ttft.append(first)
        itl += gaps
    out = {"ttft_s": ttft, "itl_s": itl}
    for name, values in (("ttft", ttft), ("itl", itl)):
        out.update({f"{name}_p{q}_ms": round(_pct(values, q / 100), 2) for q in (50, 90, 99)})
    return out


def plot(report: dict, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "ttft_s", "time to first token (ms)"),
                           (axes[1], "itl_s", "inter-token latency (ms)")):
        for side, color in (("engine", "#2a7"), ("redis", "#c60")):
            values = sorted(v * 1000 for v in report[side][key])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], color=color,
                    label=f"{'in-process engine' if side == 'engine' else 'through Redis (worker process)'}"
                          f": p50 {report[side][key[:-2] + '_p50_ms']:.0f} ms, p99 {report[side][key[:-2] + '_p99_ms']:.0f} ms")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of " + ("requests" if key == "ttft_s" else "tokens"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    m = report["machine"]
    load = f"load avg {report['load_avg_before'][0]:.1f} before, {report['load_avg_after'][0]:.1f} after"
    fig.suptitle(f"{report['model']}: {report['requests']} mixed-length requests, one every "
                 f"{report['interval_ms']:.0f} ms, greedy, {report['threads']} threads; "
                 f"{report['repeats']} alternating runs a side, pooled\n"
                 f"{m['cpu']} - {m['date']} - {load} on {m['cpus']} cores",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    import torch

    from gpu_worker.bench.workload import mixed_workload

    items = mixed_workload(args.requests, seed=args.seed)
    report = {"requests": args.requests, "seed": args.seed, "interval_ms": args.interval_ms,
              "model": Path(args.model).name if args.model else "SmolLM2-135M-Instruct (embedded)",
              "output_tokens": sum(i.max_tokens for i in items), "machine": machine()}
    report["load_avg_before"] = report["machine"]["load_avg"]
    timed: dict[str, list[list[dict]]] = {"engine": [], "redis": []}
    for _ in range(args.repeats):  # alternating, so a change in the machine's load hits both
        timed["engine"].append(measure_engine(args, items))
        with tempfile.TemporaryDirectory(prefix="fleet-latency-") as tmp:
            timed["redis"].append(measure_redis(args, items, Path(tmp)))
    report["threads"] = torch.get_num_threads()
    for side, runs in timed.items():
        report[side] = summarize([r for run in runs for r in run])  # every run's samples pooled
        report[f"{side}_runs"] = [{k: v for k, v in summarize(run).items() if k.endswith("_ms")} for run in runs]
    report["repeats"] = args.repeats
    report["load_avg_after"] = machine()["load_avg"]
    brief = {k: v for side in ("engine", "redis") for k, v in
             ((f"{side}_{name}", val) for name, val in report[side].items() if name.endswith("_ms"))}
    print(json.dumps(brief, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        plot(report, args.json.with_suffix(".png"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
