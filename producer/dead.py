"""``fleet dead list|requeue|purge``: the dead-letter stream ``fleet:MODEL:dead``.

A dead letter holds the stream it came from, its entry id, the failure ``code`` and
``message``, ``deliveries``, the ``worker_id`` and ``data`` (the head of the payload: the
first 4 KiB). ``requeue`` adds ``data`` back to its stream as a new entry, forgets the
request's stored failure (else a worker would answer the stored result again instead of
generating), then deletes the dead letter; ``purge`` deletes dead letters.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys

from producer.cli_errors import REDIS_ERRORS, redis_failed
from shared import connect, keys
from shared.scan import scan

_TENANT_IN_STREAM = re.compile(r"\{([^}]*)\}")
_HEAD_BYTES = 4096  # what a worker keeps of the payload (gpu_worker/edge/calls.py)


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("dead", help="dead letters: list, requeue, purge")
    verbs = p.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="the dead letters, oldest first")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--count", type=int, default=100, help="show at most this many")
    for name, text in (("requeue", "put dead letters back into the stream they came from"),
                       ("purge", "delete dead letters")):
        v = verbs.add_parser(name, help=text)
        v.add_argument("ids", nargs="*", metavar="ID", help="dead-letter entry ids")
        v.add_argument("--all", action="store_true", help="every dead letter")
        v.add_argument("--yes", action="store_true", help="confirm --all")
    for v in verbs.choices.values():
        add_common(v)
    p.set_defaults(_run=run)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _row(entry_id, fields: dict) -> dict:
    row = {"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()
                                     if _text(k) != "data"}}
    data = fields.get(b"data", b"")
    row["request_id"] = scan(data).request_id
    row["data_bytes"] = len(data)
    if "deliveries" in row and row["deliveries"].isdigit():
        row["deliveries"] = int(row["deliveries"])
    return row


def render(rows: list[dict]) -> str:
    lines = [f"{'id':<18}{'code':<18}{'reason':<10}{'deliveries':>10}  {'request_id':<26}"
             f"{'stream':<44}message"]
    for r in rows:
        lines.append(f"{r['id']:<18}{r.get('code', '-'):<18}{r.get('reason', '-'):<10}"
                     f"{r.get('deliveries', '-'):>10}  "
                     f"{(r['request_id'] or '-')[:25]:<26}{r.get('stream', '-')[:43]:<44}"
                     f"{r.get('message', '')[:60]}")
    return "\n".join(lines) + "\n"


async def _requeue_one(client, dead: str, entry_id: str, fields: dict) -> str | None:
    """Requeue one dead letter; a reason where it cannot be."""
    stream, data = _text(fields.get(b"stream", b"")), fields.get(b"data")
    if not stream or data is None:
        return "it has no stream or data"
    if len(data) >= _HEAD_BYTES:
        return "its payload was cut to its head when it was dead-lettered"
    found = scan(data)
    tag = _TENANT_IN_STREAM.search(stream)
    tenant = tag.group(1) if tag else found.tenant or keys.DEFAULT_TENANT
    if found.request_id is not None:
        await client.delete(keys.state_key(tenant, found.request_id),
                            keys.progress_key(tenant, found.request_id))
    await client.xadd(stream, {keys.STREAM_FIELD: data})
    await client.xdel(dead, entry_id)
    return None


async def _entries(client, dead: str, args) -> list[tuple]:
    if args.all:
        return await client.xrange(dead, "-", "+")
    out = []
    for entry_id in args.ids:
        out += await client.xrange(dead, entry_id, entry_id)
    return out


async def _run(args: argparse.Namespace) -> int:
    client = await connect.async_client(args.redis_url, socket_connect_timeout=5)
    dead = keys.dead_letter_key(args.model_name)
    try:
        if args.verb == "list":
            rows = [_row(i, f) for i, f in await client.xrange(dead, "-", "+", count=args.count)]
            sys.stdout.write(json.dumps(rows, indent=2) + "\n" if args.json else render(rows))
            return 0
        entries = await _entries(client, dead, args)
        missing = set(args.ids) - {_text(i) for i, _ in entries}
        for entry_id in sorted(missing):
            sys.stderr.write(f"no dead letter {entry_id}\n")
        done = 0
        for entry_id, fields in entries:
            if args.verb == "purge":
                done += await client.xdel(dead, entry_id)
                continue
            reason = await _requeue_one(client, dead, entry_id, fields)
            if reason:
                sys.stderr.write(f"not requeued {_text(entry_id)}: {reason}\n")
            done += reason is None
        verb = "requeued" if args.verb == "requeue" else "purged"
        sys.stdout.write(f"{verb} {done} of {len(entries)} dead letters\n")
        return 0 if done == len(entries) and not missing else 1
    finally:
        await client.aclose()


def run(args: argparse.Namespace) -> int:
    """Exit 0; 1 when some dead letters named were not found or not requeued; 2 for
    ``--all`` without ``--yes`` (or neither ids nor --all); 3 when Redis cannot be used."""
    if args.verb != "list" and (bool(args.ids) == bool(args.all) or (args.all and not args.yes)):
        sys.stderr.write(f"fleet dead {args.verb}: name dead-letter ids, or --all --yes "
                         f"(--all alone is refused: it {args.verb}s every one)\n")
        return 2
    try:
        return asyncio.run(_run(args))
    except REDIS_ERRORS as exc:
        return redis_failed("dead", args.redis_url, exc)
