"""``fleet status``: the backlog of every tenant per lane, the old shared streams while they
hold anything, dead letters, and the state of every worker.

Only per-key commands, pipelined (a cluster client sends each node its share at once), so
the same code reads one server or a Redis Cluster given any node's URL.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from redis.exceptions import ResponseError

from producer.cli_errors import REDIS_ERRORS, redis_failed

from shared import connect, keys, tenants
from shared.tenants import TenantConfig

FIELDS = ("length", "lag", "pending", "consumers")


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("status", help="backlog per tenant and lane (length, lag, pending), "
                                      "dead letters, workers")
    add_common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(_run=run)


def _numbers(length: int, groups: list[dict]) -> dict:
    group = next((g for g in groups if g["name"] in (keys.GROUP, keys.GROUP.encode())), None)
    pending = int(group["pending"]) if group else 0
    lag = group.get("lag") if group else length
    if lag is None:
        # Served entries are deleted on ack, so what remains is pending or undelivered.
        lag = max(length - pending, 0)
    return {"length": int(length), "lag": int(lag), "pending": pending,
            "consumers": int(group["consumers"]) if group else 0}


async def read_streams(client, streams: list[str]) -> dict[str, dict | None]:
    """stream -> {length, lag, pending, consumers}; None where the stream does not exist."""
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
        pipe.xinfo_groups(stream)
    replies = await pipe.execute(raise_on_error=False)
    out = {}
    for i, stream in enumerate(streams):
        length, groups = replies[2 * i], replies[2 * i + 1]
        if isinstance(length, Exception):
            raise length
        if isinstance(groups, ResponseError) and "no such key" in str(groups).lower():
            out[stream] = None
            continue
        if isinstance(groups, Exception):
            raise groups
        out[stream] = _numbers(length, groups)
    return out


async def read_registry(client) -> tuple[dict[str, TenantConfig], list[str]]:
    """The registered tenants (the implicit ``default`` where none is) and invalid entries."""
    return tenants.parse_registry(await client.hgetall(keys.tenants_key()))


def _sum(rows) -> dict:
    return {f: sum(r[f] for r in rows) for f in FIELDS}


async def _backlog(client, model: str, configs: dict[str, TenantConfig]) -> dict:
    """Per tenant its allowed lanes and any other lane whose stream exists; the legacy
    streams that exist; and per lane the totals of both."""
    wanted = {(t, lane): keys.stream_key(model, t, lane) for t in sorted(configs)
              for lane in keys.LANES}
    legacy = {lane: keys.legacy_stream_key(model, lane) for lane in keys.LANES}
    found = await read_streams(client, [*wanted.values(), *legacy.values()])
    by_tenant: dict[str, dict] = {t: {} for t in sorted(configs)}
    for (t, lane), stream in wanted.items():
        numbers = found[stream]
        if numbers is not None or lane in configs[t].lanes:
            by_tenant[t][lane] = numbers or dict.fromkeys(FIELDS, 0)
    old = {lane: found[s] for lane, s in legacy.items() if found[s] is not None}
    totals = {lane: _sum([*(lanes[lane] for lanes in by_tenant.values() if lane in lanes),
                          *([old[lane]] if lane in old else [])]) for lane in keys.LANES}
    return {"tenants": by_tenant, "legacy": old, "streams": totals}


async def _workers(client, model: str) -> dict:
    now = time.time()
    seen = await client.zrange(keys.workers_key(model), 0, -1, withscores=True)
    pipe = client.pipeline(transaction=False)
    for worker_id, _ in seen:
        pipe.hgetall(keys.worker_key(model, worker_id))
    infos = await pipe.execute() if seen else []
    return {worker_id: {"alive": bool(info), "last_seen_s": round(now - last, 1),
                        **{k: _number(v) for k, v in info.items()}}
            for (worker_id, last), info in zip(seen, infos)}


def _number(value: str) -> int | float | str:
    """A worker's status field as the number it is (Redis hashes hold strings)."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


async def collect_from(client, model: str, registry=None) -> dict:
    """What ``fleet status`` shows, read through ``client`` (decoded responses).
    ``registry``: a :func:`read_registry` result already read this round."""
    configs, bad = registry if registry is not None else await read_registry(client)
    report = {"model": model, **await _backlog(client, model, configs),
              "invalid_tenants": sorted(bad)}
    report["dead_letters"] = await client.xlen(keys.dead_letter_key(model))
    report["workers"] = await _workers(client, model)
    report["known"] = bool(report["workers"] or report["dead_letters"] or report["legacy"]
                           or any(s["length"] or s["consumers"]
                                  for s in report["streams"].values()))
    return report


async def collect(redis_url: str, model: str) -> dict:
    """Everything ``fleet status`` shows, as one dict (also used by tests and the demo).
    ``streams`` holds per lane the totals over every tenant and the legacy stream."""
    client = await connect.async_client(redis_url, decode_responses=True)
    try:
        return await collect_from(client, keys.check_model(model))
    finally:
        await client.aclose()


def _row(name: str, lane: str, s: dict) -> str:
    return (f"  {name:<22}{lane:<9}{s['length']:>8}{s['lag']:>8}{s['pending']:>9}"
            f"{s['consumers']:>11}")


def render(report: dict) -> str:
    lines = [f"model {report['model']}",
             "  tenant                lane       length     lag  pending  consumers"]
    for tenant, lanes in report["tenants"].items():
        lines += [_row(tenant, lane, s) for lane, s in lanes.items()]
    lines += [_row("(old shared stream)", lane, s) for lane, s in report["legacy"].items()]
    lines += [_row("(all)", lane, s) for lane, s in report["streams"].items()]
    if report["invalid_tenants"]:
        lines.append(f"  invalid registry entries (ignored): {', '.join(report['invalid_tenants'])}")
    lines.append(f"  dead letters: {report['dead_letters']}")
    lines.append("  worker                          alive  draining  running  waiting  kv_usage"
                 "  last_seen")
    for worker_id, w in report["workers"].items():
        draining = {1: "yes", 0: "no"}.get(w.get("draining"), "-")
        lines.append(f"  {worker_id:<32}{'yes' if w['alive'] else 'no':<7}{draining:<9}"
                     f"{w.get('running', '-'):>8}{w.get('waiting', '-'):>9}"
                     f"{w.get('kv_usage', '-'):>10}{w['last_seen_s']:>10}s")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Exit 0; 3 (one line on stderr) when Redis cannot be read."""
    try:
        report = asyncio.run(collect(args.redis_url, args.model_name))
    except REDIS_ERRORS as exc:
        return redis_failed("status", args.redis_url, exc)
    if not report["known"]:
        sys.stderr.write(f"warning: nothing under the model namespace {args.model_name!r} (no "
                         "worker, stream or dead letter); is --model-name right?\n")
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render(report))
    return 0
