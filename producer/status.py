"""``fleet status``: the backlog per lane and the state of every worker."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared import keys


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("status", help="streams (length, lag, pending, dead letters) and workers")
    add_common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(_run=run)


async def _group(client: aioredis.Redis, stream: str) -> dict:
    length = await client.xlen(stream)
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no stream yet
        groups = []
    group = next((g for g in groups if g["name"] in (keys.GROUP, keys.GROUP.encode())), None)
    pending = int(group["pending"]) if group else 0
    lag = group.get("lag") if group else length
    if lag is None:
        # Served entries are deleted on ack, so what remains is pending or undelivered.
        lag = max(length - pending, 0)
    return {"length": length, "lag": int(lag), "pending": pending,
            "consumers": int(group["consumers"]) if group else 0}


async def collect(redis_url: str, model: str) -> dict:
    """Everything ``fleet status`` shows, as one dict (also used by tests and the demo)."""
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        streams = {lane: await _group(client, keys.stream_key(model, lane)) for lane in keys.LANES}
        dead = await client.xlen(keys.dead_letter_key(model))
        workers = {}
        now = time.time()
        for worker_id, seen in await client.zrange(keys.workers_key(model), 0, -1, withscores=True):
            info = await client.hgetall(keys.worker_key(model, worker_id))
            workers[worker_id] = {"alive": bool(info), "last_seen_s": round(now - seen, 1), **info}
        return {"model": model, "streams": streams, "dead_letters": dead, "workers": workers}
    finally:
        await client.aclose()


def render(report: dict) -> str:
    lines = [f"model {report['model']}", "  lane      length     lag  pending  consumers"]
    for lane, s in report["streams"].items():
        lines.append(f"  {lane:<8}{s['length']:>8}{s['lag']:>8}{s['pending']:>9}{s['consumers']:>11}")
    lines.append(f"  dead letters: {report['dead_letters']}")
    lines.append("  worker                          alive  running  waiting  kv_usage  last_seen")
    for worker_id, w in report["workers"].items():
        lines.append(f"  {worker_id:<32}{'yes' if w['alive'] else 'no':<7}{w.get('running', '-'):>7}"
                     f"{w.get('waiting', '-'):>9}{w.get('kv_usage', '-'):>10}{w['last_seen_s']:>10}s")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(collect(args.redis_url, args.model_name))
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render(report))
    return 0
