"""``fleet bench peers``: this engine against vLLM's CPU build and llama.cpp on the same CPU.

Each engine runs in a process of its own, one after another, on the same threads, with
the 64-request mixed workload of ``fleet bench throughput`` (same seed, token ids and fixed
output lengths, greedy, ignore_eos) after a warm-up, then one request alone (a 32-token
prompt, 128 generated tokens). Reported per engine: throughput (useful output tokens / wall
time of the workload), batch-1 decode and end-to-end tokens/s, and greedy agreement with
this engine's outputs. Peers that ``ops/bench/install_peers.sh`` has not installed are
skipped with a hint. ``--quality``: llama.cpp's formats against this engine's fp32 instead
(peers_quality).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_worker.bench import peers_discovery as disc
from gpu_worker.bench.peers_report import agreement, figures, paired_ratios, summarize_rounds, table
from gpu_worker.bench.pictures import machine
from gpu_worker.bench.workload import TOKEN_RANGE, mixed_workload
from kernels import cpuinfo

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
ENGINES = ("engine", "vllm", "llama")
RUN_TIMEOUT_S = 1800


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpu_worker.bench.peers_quality import add_quality_arguments

    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="this engine's model (default: the embedded SmolLM2); "
                   "the peers always load the embedded model's weights")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engine-args", default="", help="extra `fleet worker` engine arguments for this "
                   "engine, e.g. '--quantization int8' (default: fp32)")
    p.add_argument("--vllm-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="vLLM's dtype (bfloat16: beside --engine-args '--dtype bfloat16')")
    p.add_argument("--ggufs", default="F32,Q4_1", help="llama.cpp formats to run: F32, Q8_0, Q4_K_M, Q4_1")
    p.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. --llama-args=--no-repack "
                   "(a server killed by a signal at load is retried once with --no-repack anyway: on an Intel "
                   "Xeon with AMX, llama.cpp 0.3.36's Q4_1 and Q8_0 weight repacking crashes)")
    p.add_argument("--skip", default="", help=f"comma-separated engines to leave out: {', '.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=1, help="this engine and vLLM loaded side by side, taking "
                   "turns this many times (ABBA); each figure the median of its rounds, with the ratio of "
                   "each round's pair (peers_rounds). llama.cpp runs once, after the rounds")
    p.add_argument("--batch1-prompt", type=int, default=32)
    p.add_argument("--batch1-tokens", type=int, default=128)
    p.add_argument("--batch1-reps", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, help="write every figure, versions and settings here")
    add_quality_arguments(p)


def make_job(args: argparse.Namespace, model_dir: str) -> dict:
    """The job every runner gets: the workload, the batch-1 request, the peers' model dir."""
    items = mixed_workload(args.requests, args.seed)
    rng = random.Random(args.seed + 1)
    prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(args.batch1_prompt)]
    return {"model": model_dir, "workload": [[i.prompt_token_ids, i.max_tokens] for i in items],
            "batch1": {"prompt": prompt, "tokens": args.batch1_tokens, "reps": args.batch1_reps}}


def cpu_info() -> dict:
    """The CPU as /proc/cpuinfo names it (model name, family, model) and the vector
    instructions the comparison depends on."""
    cpu = cpuinfo.first_cpu()
    fields = {k: cpu[k] for k in ("model name", "cpu family", "model") if k in cpu}
    flags = cpuinfo.flags()
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    return {"cpu_fields": fields, "cpu_flags": [f for f in wanted if f in flags]}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _subprocess_run(runner: list[str], extra: list[str], job: dict, env: dict[str, str], log_path: Path) -> dict:
    """``runner JOB.json OUT.json *extra`` in a process of its own; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        with open(log_path, "w") as log:
            rc = subprocess.run([*runner, str(job_path), str(out_path), *extra], env={**os.environ, **env},
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
                                check=False).returncode
        if rc != 0:
            raise RuntimeError(f"{runner[-1]} exited with {rc}; see {log_path}")
        return json.loads(out_path.read_text())


def runners(args: argparse.Namespace, job: dict, logs: Path, skip: set[str]) -> tuple[dict, dict]:
    """This engine's and vLLM's runners (name -> peers_rounds.Runner), and {name: {"skipped":
    why}} for a vLLM that is not installed."""
    from gpu_worker.bench.peers_rounds import Runner

    found: dict[str, Runner] = {}
    missing: dict[str, dict] = {}
    if "engine" not in skip:
        name = "this engine" + (f" {args.engine_args}" if args.engine_args else ", fp32")
        found[name] = Runner([sys.executable, "-m", "gpu_worker.bench.peers_engine"],
                             ["--threads", str(args.threads), *shlex.split(args.engine_args)],
                             {**job, "model": args.model}, {"OMP_NUM_THREADS": str(args.threads)},
                             logs / "engine.log")
    if "vllm" not in skip:
        vllm = disc.find_vllm()
        label = "vLLM CPU, " + {"float32": "fp32", "bfloat16": "bf16"}[args.vllm_dtype]
        if not vllm.ok:
            missing[label] = {"skipped": vllm.missing}
        else:
            found[label] = Runner([str(vllm.paths["python"]), str(Path(__file__).with_name("peers_vllm_runner.py"))],
                                  [], {**job, "dtype": args.vllm_dtype}, disc.vllm_env(vllm, args.threads),
                                  logs / "vllm.log")
    return found, missing


def run_engines(args: argparse.Namespace, job: dict, logs: Path) -> dict[str, dict]:
    """Every engine not skipped: name -> run result (with --rounds, its rounds as one row:
    peers_report.summarize_rounds) or {"skipped": why}. Without --rounds, one after another."""
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    found, runs = runners(args, job, logs, skip)
    if args.rounds > 1 and found:
        from gpu_worker.bench.peers_rounds import run_rounds

        for name, result in run_rounds(found, args.rounds, RUN_TIMEOUT_S).items():
            runs[name] = result if isinstance(result, dict) else summarize_rounds(result)
    else:
        for name, r in found.items():
            runs[name] = _guarded(lambda r=r: _subprocess_run(r.command, r.extra, r.job, r.env, r.log_path))
    if "llama" not in skip:
        runs.update(_run_llama(args, job, logs))
    return {name: runs[name] for name in (*found, *(n for n in runs if n not in found))}


def _run_llama(args: argparse.Namespace, job: dict, logs: Path) -> dict[str, dict]:
    from gpu_worker.bench.peers_llama import run_llama

    formats = tuple(f.strip() for f in args.ggufs.split(",") if f.strip())
    found = disc.find_llama(formats=formats)
    if not found.ok:
        return {"llama.cpp": {"skipped": found.missing}}
    extra = tuple(shlex.split(args.llama_args))
    return {f"llama.cpp {fmt}": _guarded(lambda fmt=fmt: run_llama(
        found.paths["llama-server"], found.paths[fmt], job, args.threads, logs / f"llama-{fmt}.log", extra))
        for fmt in formats}


def _guarded(fn) -> dict:
    """A peer that fails is reported as skipped with its error; the others still run."""
    try:
        return fn()
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        logger.error("run failed: %s", exc)
        return {"skipped": f"failed: {exc}"}


def _paired_line(rows: dict[str, dict]) -> tuple[dict, str] | None:
    """With rounds: this engine's figures over vLLM's, round by round, and a line saying so."""
    mine = next((r for n, r in rows.items() if n.startswith("this engine") and "rounds" in r), None)
    vllm = next((r for n, r in rows.items() if n.startswith("vLLM") and "rounds" in r), None)
    if mine is None or vllm is None:
        return None
    ratios = paired_ratios(mine, vllm)
    thr, b1 = ratios["throughput_tok_s"], ratios["batch1_decode_tok_s"]
    line = (f"this engine / vLLM, per round: throughput {', '.join(f'{x:.2f}' for x in thr['per_round'])} "
            f"(median {thr['median']:.2f}x); batch-1 decode {', '.join(f'{x:.2f}' for x in b1['per_round'])} "
            f"(median {b1['median']:.2f}x)")
    return ratios, line


def run(args: argparse.Namespace) -> int:
    if args.quality:
        from gpu_worker.bench.peers_quality import run_quality

        return run_quality(args)
    from gpu_worker.model.default_model import default_model_dir

    job = make_job(args, str(default_model_dir()))
    logs = Path(tempfile.mkdtemp(prefix="fleet-bench-peers-"))
    result = {**machine(), **cpu_info(), "uptime_before": _uptime(), "threads": args.threads, "logs": str(logs),
              "workload": {"requests": args.requests, "seed": args.seed,
                           "prompt_tokens": sum(len(p) for p, _ in job["workload"]),
                           "output_tokens": sum(n for _, n in job["workload"]),
                           "batch1": {k: v for k, v in job["batch1"].items() if k != "prompt"}},
              "peer_versions": disc.versions(), "engines": {}}
    runs = run_engines(args, job, logs)
    result["uptime_after"] = _uptime()
    ref = next((r["outputs"] for name, r in runs.items() if name.startswith("this engine") and "outputs" in r), None)
    for name, r in runs.items():
        row = r if "skipped" in r else figures(r) if "rounds" not in r else {k: v for k, v in r.items()
                                                                             if k != "outputs"}
        if ref is not None and "outputs" in r:
            row["agreement"] = agreement(ref, r["outputs"])
        result["engines"][name] = row
    result["table"] = table(result["engines"])
    print(result["table"])
    paired = _paired_line(result["engines"])
    if paired:
        result["paired"], line = paired
        print(line)
    print(f"{result['cpu']}, {result['date']}; before: {result['uptime_before']}; after: {result['uptime_after']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
