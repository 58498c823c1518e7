"""``fleet batch IN.jsonl OUT.jsonl``: a resumable batch pipeline with a bounded window.

Each input line is a request object (the fields of :class:`~shared.protocol.Request`;
``request_id`` optional). A line without an id gets one derived from its number and
content, so a rerun submits the same ids: lines already in OUT are skipped, and lines that
were in flight when the run was interrupted are picked up again without generating twice
(the fleet is idempotent by request id). Output lines, in completion order:
``{"line": n, "request_id": ..., "result": {...}}`` or ``{..., "failure": {...}}``.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
import time

import msgspec

from producer.client import AsyncFleetClient
from producer.errors import RequestFailed
from shared.protocol import Request

logger = logging.getLogger(__name__)


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("batch", help="run a JSONL file of requests; resumable")
    add_common(p)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--window", type=int, default=64, help="most requests in flight")
    p.add_argument("--lane", choices=("high", "default", "batch"), default="batch")
    p.add_argument("--tenant", default="default")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(_run=run)


def line_request(number: int, line: str, *, tenant: str, lane: str) -> Request:
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("each line must be a JSON object")
    digest = hashlib.sha256(line.encode()).hexdigest()[:16]
    fields.setdefault("request_id", f"batch-{number}-{digest}")
    fields.setdefault("tenant", tenant)
    fields.setdefault("priority", lane)
    fields.setdefault("submitted_at", time.time())
    return msgspec.convert(fields, Request)


def finished_ids(path: str) -> set[str]:
    """Ids already written; a torn last line (interrupted write) is cut off."""
    if not os.path.exists(path):
        return set()
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            f.truncate(keep)
    return {json.loads(line)["request_id"] for line in data[:keep].splitlines() if line.strip()}


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.done = self.tokens = self.failed = 0
        self.t0 = time.perf_counter()
        self._last = 0.0

    def add(self, tokens: int, failed: bool) -> None:
        self.done += 1
        self.tokens += tokens
        self.failed += int(failed)
        now = time.perf_counter()
        if not self.quiet and (now - self._last > 0.5 or self.done == self.total):
            self._last = now
            dt = max(now - self.t0, 1e-9)
            sys.stderr.write(f"\r{self.done}/{self.total} requests  {self.done / dt:.2f} req/s  "
                             f"{self.tokens / dt:.1f} tok/s  {self.failed} failed ")
            sys.stderr.flush()


async def run_batch(args: argparse.Namespace) -> int:
    done = finished_ids(args.output)
    with open(args.input, encoding="utf-8") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    todo, invalid = [], 0
    for number, line in lines:
        try:
            request = line_request(number, line, tenant=args.tenant, lane=args.lane)
        except (ValueError, msgspec.ValidationError) as exc:
            logger.error("line %d is not a valid request, skipped: %s", number, exc)
            invalid += 1
            continue
        if request.request_id not in done:
            todo.append((number, request))
    progress = _Progress(len(todo), args.quiet)
    progress.failed = invalid
    window = asyncio.Semaphore(args.window)
    async with AsyncFleetClient(args.redis_url, model=args.model_name, tenant=args.tenant,
                                poll_s=5.0) as fleet:
        with open(args.output, "a", encoding="utf-8") as out:
            async def one(number: int, request: Request) -> None:
                try:
                    stream = await fleet.submit(request)
                    try:
                        result = await stream.result()
                        record = {"result": msgspec.to_builtins(result)}
                        tokens, failed = result.usage.completion_tokens, False
                    except RequestFailed as exc:
                        record = {"failure": msgspec.to_builtins(exc.failure)}
                        tokens, failed = 0, True
                    out.write(json.dumps({"line": number, "request_id": request.request_id,
                                          **record}) + "\n")
                    out.flush()
                    progress.add(tokens, failed)
                finally:
                    window.release()

            tasks = []
            for number, request in todo:
                await window.acquire()
                tasks.append(asyncio.create_task(one(number, request)))
            await asyncio.gather(*tasks)
    if not args.quiet:
        sys.stderr.write("\n")
    return 1 if progress.failed else 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(run_batch(args))
