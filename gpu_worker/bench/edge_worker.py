"""The worker of ``fleet bench edge``: the real :class:`~gpu_worker.edge.worker.Worker`
serving the synthetic engine, in a process of its own so its CPU time is its own.

``python -m gpu_worker.bench.edge_worker CONFIG_JSON``; SIGTERM drains it (as a real worker).
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys

from gpu_worker.bench.edge_engine import SyntheticEngine
from gpu_worker.edge.options import WorkerOptions
from gpu_worker.edge.worker import Worker


def build(config: dict) -> Worker:
    """``config``: redis_url, model_name, worker_id, seqs, step_ms, tokens_per_step,
    stream_interval_ms, baseline (run the scripts as they were before the cuts)."""
    engine = SyntheticEngine(max_num_seqs=config["seqs"], step_s=config["step_ms"] / 1000.0,
                             tokens_per_step=config["tokens_per_step"])
    options = WorkerOptions(redis_url=config["redis_url"], model_name=config["model_name"],
                            worker_id=config["worker_id"], local_queue=config["local_queue"],
                            stream_interval_ms=config["stream_interval_ms"], block_ms=100,
                            heartbeat_s=1.0, drain_grace_s=5.0)
    worker = Worker(engine, options)
    if config["baseline"]:
        from gpu_worker.bench import edge_baseline
        edge_baseline.install(worker.state.io)
    return worker


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    worker = build(json.loads(argv[1]))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(worker.run())
    return uvloop.run(worker.run())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
