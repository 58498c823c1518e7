"""The per-event script alone, for ``fleet bench edge``: server CPU per PUBLISH call, the
pre-cut script against the cut one, in identical pipelines (no worker, no subscriber), so
the difference is the scripts' own and not the machine's load or the pipelines' sizes.

Each request's keys are on the node owning its slot; a plain client per node sends that
node's calls, one pipeline of every request per round; the variants alternate by round.
"""
from __future__ import annotations

import redis
from redis.crc import key_slot

from gpu_worker.bench.edge_baseline import PUBLISH as BASELINE_PUBLISH
from gpu_worker.bench.edge_redis import cpu_seconds
from gpu_worker.edge import scripts
from shared import codec, keys
from shared.protocol import Token

_OWNER = "bench#1"
_TTL_MS = 86_400_000


def _requests(admin: list[redis.Redis], slot_owner, tag: str, num: int) -> list[tuple[int, list[str]]]:
    """``num`` begun requests (an owner, a TTL): (node index, their KEYS)."""
    out = []
    for i in range(num):
        request_keys = keys.request_keys(keys.DEFAULT_TENANT, f"{tag}-{i}")
        node = slot_owner(key_slot(request_keys[0].encode()))
        admin[node].hset(request_keys[0], "owner", _OWNER)
        admin[node].pexpire(request_keys[0], _TTL_MS)
        out.append((node, request_keys))
    return out


def _round(admin, shas: list[str], requests, seq: int, publish_command: str) -> None:
    event = codec.encode(Token(request_id="0" * 32, seq=seq, token_ids=[12345], text="abcd"))
    pipes = [client.pipeline(transaction=False) for client in admin]
    for node, request_keys in requests:
        pipes[node].evalsha(shas[node], 4, *request_keys, _OWNER, _TTL_MS, publish_command,
                            event, "", seq, seq + 1)
    for pipe in pipes:
        pipe.execute()


def publish_cost(admin: list[redis.Redis], slot_owner, *, cluster: bool, num_requests: int = 200,
                 rounds: int = 30) -> dict:
    """Server microseconds of CPU per PUBLISH call: ``baseline`` and ``cut``."""
    command = "SPUBLISH" if cluster else "PUBLISH"
    variants = {"baseline": BASELINE_PUBLISH, "cut": scripts.PUBLISH}
    shas = {name: [client.script_load(src) for client in admin] for name, src in variants.items()}
    requests = {name: _requests(admin, slot_owner, f"script-{name}", num_requests) for name in variants}
    spent = dict.fromkeys(variants, 0.0)
    for seq in range(rounds):
        for name in variants:
            before = cpu_seconds(admin)
            _round(admin, shas[name], requests[name], seq, command)
            spent[name] += cpu_seconds(admin) - before
    per_call = {name: round(1e6 * cpu / (rounds * num_requests), 2) for name, cpu in spent.items()}
    per_call["cut_over_baseline"] = round(per_call["cut"] / per_call["baseline"], 3)
    return per_call
