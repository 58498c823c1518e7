"""``fleet batch IN.jsonl OUT.jsonl``: a resumable batch pipeline with a bounded window.

Two input formats, told apart per file by its first line:

- **fleet**: each line a request object (the fields of :class:`~shared.protocol.Request`;
  ``request_id`` optional: without one the id is a digest of the line alone). Output:
  ``{"line": n, "request_id": ..., "metadata": {...}, "result": {...}}`` or ``{...,
  "failure": {...}}`` (``metadata``, the line's own, where it has any).
- **OpenAI Batch** (``{"custom_id", "method", "url", "body"}``, as vLLM's ``run-batch``
  takes): output lines are OpenAI Batch output lines (:mod:`producer.gateway.openai_batch`).

Lines come out in completion order, or in input order with ``--ordered``. A rerun skips the
lines already in OUT, and lines in flight when a run was interrupted are picked up again
without generating twice (the fleet is idempotent by request id). The input is read one
line at a time, so memory is bounded by the window, not the file.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import msgspec

from producer import batch_io
from producer.gateway import openai_batch
from producer.batch_progress import Progress
from producer.cli_errors import EXIT_FILE, REDIS_ERRORS, redis_failed
from producer.client import AsyncFleetClient
from producer.errors import RequestFailed
from producer.gateway.render import TokenNames

logger = logging.getLogger(__name__)


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("batch", help="run a JSONL file of requests (fleet or OpenAI Batch "
                                     "format); resumable")
    add_common(p)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--window", type=int, default=64, help="most requests in flight")
    p.add_argument("--lane", choices=("high", "default", "batch"), default="batch")
    p.add_argument("--tenant", default="default")
    p.add_argument("--ordered", action="store_true",
                   help="write output lines in input order (default: as they complete)")
    p.add_argument("--progress-every", type=float, default=10.0, metavar="S",
                   help="seconds between progress lines when stderr is not a terminal")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(_run=run)


async def _fleet_record(fleet: AsyncFleetClient, job: batch_io.Job) -> tuple[dict, int, bool]:
    stream = await fleet.submit(job.request)
    try:
        result = await stream.result()
    except RequestFailed as exc:
        return {"failure": msgspec.to_builtins(exc.failure)}, 0, True
    return {"result": msgspec.to_builtins(result)}, result.usage.completion_tokens, False


async def _record(fleet, job: batch_io.Job, lane: str, names: TokenNames) -> tuple[dict, int, bool]:
    """The output line of ``job``, its completion tokens, and whether it failed."""
    if job.request is not None:
        record, tokens, failed = await _fleet_record(fleet, job)
        meta = {"metadata": job.request.metadata} if job.request.metadata else {}
        return {"line": job.number, "request_id": job.request_id, **meta, **record}, tokens, failed
    if job.refused is not None:
        return openai_batch.refused_line(job.key, job.refused), 0, True
    job.line.fields["priority"] = lane
    line = await openai_batch.run_line(fleet, job.line, job.request_id, names)
    body = line["response"]["body"]
    tokens = body.get("usage", {}).get("completion_tokens", 0) if isinstance(body, dict) else 0
    return line, tokens, not openai_batch.is_success(line)


async def _pipeline(args, fleet, fmt: str, progress: Progress, done) -> None:
    window = asyncio.Semaphore(args.window)
    names = TokenNames(None)
    fatal: list[BaseException] = []
    errors: list[tuple[int, str]] = []
    with open(args.output, "a", encoding="utf-8") as out:
        writer = batch_io.Writer(out, args.ordered, on_written=window.release)

        async def one(seq: int, job: batch_io.Job) -> None:
            try:
                record, tokens, failed = await _record(fleet, job, args.lane, names)
            except BaseException as exc:
                fatal.append(exc)
                window.release()
                raise
            writer.put(seq, record)
            progress.add(tokens, failed)

        tasks, seq = [], 0
        try:
            for job in batch_io.jobs(args.input, fmt, tenant=args.tenant, lane=args.lane,
                                     errors=errors):
                _skip_invalid(errors, progress)
                if done[job.key] > 0:
                    done[job.key] -= 1
                    continue
                await window.acquire()
                if fatal:
                    raise fatal[0]
                tasks.append(asyncio.create_task(one(seq, job)))
                seq += 1
            _skip_invalid(errors, progress)
            await asyncio.gather(*tasks)
        finally:  # interrupted or failed: no line task outlives the client's connection
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _skip_invalid(errors: list, progress: Progress) -> None:
    while errors:
        number, message = errors.pop()
        logger.error("line %d is not a valid request, skipped: %s", number, message)
        progress.total -= 1
        progress.failed += 1


async def run_batch(args: argparse.Namespace, state: dict | None = None) -> int:
    fmt = batch_io.detect_format(args.input)
    done = batch_io.finished(args.output)
    progress = Progress(batch_io.count_lines(args.input), sum(done.values()), quiet=args.quiet,
                        every_s=args.progress_every)
    if state is not None:
        state["progress"] = progress
    async with AsyncFleetClient(args.redis_url, model=args.model_name, tenant=args.tenant,
                                poll_s=5.0, socket_connect_timeout=5) as fleet:
        await fleet.redis.ping()
        await _pipeline(args, fleet, fmt, progress, done)
    progress.show()
    progress.end()
    return 1 if progress.failed else 0


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every line succeeded, 1 when some failed (their lines say why), 2 on a
    file error, 3 when Redis cannot be used, 130 when interrupted (rerun to resume)."""
    state: dict = {}
    try:
        return asyncio.run(run_batch(args, state))
    except KeyboardInterrupt:
        progress = state.get("progress")
        where = f"{progress.written}/{progress.total}" if progress else "0/?"
        if progress:
            progress.end()
        sys.stderr.write(f"interrupted: {where} written; rerun the same command to resume\n")
        return 130
    except REDIS_ERRORS as exc:
        return redis_failed("batch", args.redis_url, exc)
    except OSError as exc:
        sys.stderr.write(f"fleet batch: {exc.filename or ''}: {exc.strerror or exc}\n")
        return EXIT_FILE
    except batch_io.BadOutput as exc:
        sys.stderr.write(f"fleet batch: {exc}\n")
        return EXIT_FILE
