"""``fleet tenants``: the tenant registry (``fleet:tenants``) and each tenant's ACL user.

``add`` registers (or updates) a tenant, ``remove`` unregisters it, ``list`` shows the
registry, ``acl`` prints the tenant's ACL rule (an aclfile line) or, with ``--apply``, sets
it on the server -- on a Redis Cluster on every master and replica, since ACLs are per node.
Workers re-read the registry every few seconds, so nothing needs a restart. Notes for the
operator go to stderr, so ``fleet tenants acl NAME ... >> users.acl`` writes the rule only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis

from shared import connect, keys, tenants
from shared.tenants import TenantConfig

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_ACL_TOKEN_RE = re.compile(r"\([^)]*\)|\S+")  # a selector "(...)" is one argument


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("tenants", help="register tenants (lanes, weight, limits) and render "
                                       "or apply their ACL users")
    actions = p.add_subparsers(dest="tenants_command", required=True)
    a = actions.add_parser("add", help="register a tenant, or update its entry")
    a.add_argument("name")
    a.add_argument("--lanes", default="default,batch",
                   help="comma-separated lanes it may enqueue into (default: default,batch)")
    a.add_argument("--weight", type=float, default=1.0,
                   help="its share of a worker within a lane, relative to other tenants")
    a.add_argument("--max-running", type=int, default=None,
                   help="the most of its requests one worker runs at once (default: no cap)")
    a.set_defaults(_run=run_add)
    r = actions.add_parser("remove", help="unregister a tenant (its streams and ACL user stay)")
    r.add_argument("name")
    r.set_defaults(_run=run_remove)
    ls = actions.add_parser("list", help="the registered tenants")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(_run=run_list)
    acl = actions.add_parser("acl", help="print (or --apply) the tenant's ACL user")
    acl.add_argument("name")
    secret = acl.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password-sha256", metavar="HEX", help="SHA-256 of the password")
    secret.add_argument("--password-env", metavar="VAR",
                        help="environment variable holding the password (hashed here)")
    acl.add_argument("--model", default="*",
                     help="the model namespace whose streams the user may write (default: all)")
    acl.add_argument("--apply", action="store_true",
                     help="ACL SETUSER on the server (every node of a cluster)")
    acl.set_defaults(_run=run_acl)
    for action in (a, r, ls, acl):
        add_common(action)


def _registry(client) -> tuple[dict[str, TenantConfig], list[str], bool]:
    """(tenants, invalid entry names, whether the registry is empty)."""
    raw = client.hgetall(keys.tenants_key())
    found, bad = tenants.parse_registry(raw)
    return found, bad, not raw


def _note(text: str) -> None:
    sys.stderr.write(text + "\n")


def _describe(config: TenantConfig) -> str:
    cap = "-" if config.max_running is None else str(config.max_running)
    return f"lanes {','.join(config.lanes)}, weight {config.weight:g}, max running {cap}"


def make_config(args: argparse.Namespace) -> TenantConfig:
    """The entry ``add`` writes, validated as workers will decode it."""
    fields = {"name": args.name, "lanes": [x.strip() for x in args.lanes.split(",") if x.strip()],
              "weight": args.weight, "max_running": args.max_running}
    return msgspec.convert(fields, TenantConfig)


def run_add(args: argparse.Namespace) -> int:
    try:
        config = make_config(args)
    except msgspec.ValidationError as exc:
        _note(f"invalid tenant: {exc}")
        return 2
    client = connect.sync_client(args.redis_url)
    try:
        was_empty = client.hlen(keys.tenants_key()) == 0
        created = client.hset(keys.tenants_key(), config.name, tenants.encode(config))
    finally:
        client.close()
    print(f"{'added' if created else 'updated'} tenant {config.name}: {_describe(config)}")
    if was_empty and config.name != keys.DEFAULT_TENANT:
        _note(f"note: the registry was empty, so the fleet served the implicit tenant "
              f"{keys.DEFAULT_TENANT!r} on every lane; now it serves registered tenants only "
              f"(fleet tenants add {keys.DEFAULT_TENANT} --lanes {','.join(keys.LANES)} "
              "if clients still enqueue as it)")
    return 0


def _waiting(client, model: str, name: str) -> dict[str, int]:
    """stream -> length, for each lane stream of the tenant (none for a malformed name)."""
    try:
        streams = [keys.stream_key(model, name, lane) for lane in keys.LANES]
    except ValueError:
        return {}
    return {stream: client.xlen(stream) for stream in streams}


def run_remove(args: argparse.Namespace) -> int:
    client = connect.sync_client(args.redis_url)
    try:
        removed = client.hdel(keys.tenants_key(), args.name)
        now_empty = client.hlen(keys.tenants_key()) == 0
        waiting = _waiting(client, args.model_name, args.name) if removed else {}
    finally:
        client.close()
    if not removed:
        _note(f"no tenant {args.name!r} is registered")
        return 1
    print(f"removed tenant {args.name}")
    for stream, length in waiting.items():
        if length:
            _note(f"note: {length} entries remain in {stream}; workers no longer read it "
                  "(re-add the tenant to have them served, or DEL the stream)")
    _note(f"note: its streams ({keys.stream_pattern('*', args.name)}) and its ACL user "
          f"tenant-{args.name} are left as they are: drain or delete them, and ACL DELUSER "
          "on every node (the user can still enqueue until then)")
    if now_empty:
        _note(f"note: the registry is now empty: the fleet serves the implicit tenant "
              f"{keys.DEFAULT_TENANT!r} on every lane")
    return 0


def run_list(args: argparse.Namespace) -> int:
    client = connect.sync_client(args.redis_url)
    try:
        found, bad, empty = _registry(client)
    finally:
        client.close()
    if args.json:
        out = {"tenants": [msgspec.to_builtins(found[n]) for n in sorted(found)],
               "invalid": sorted(bad), "implicit_default": empty}
        print(json.dumps(out, indent=2))
        return 0
    if empty:
        print(f"no tenants registered: the fleet serves the implicit tenant "
              f"{keys.DEFAULT_TENANT!r} on every lane")
        return 0
    print(f"{'tenant':<24}{'lanes':<22}{'weight':>8}{'max running':>13}")
    for name in sorted(found):
        c = found[name]
        cap = "-" if c.max_running is None else str(c.max_running)
        print(f"{name:<24}{','.join(c.lanes):<22}{c.weight:>8g}{cap:>13}")
    for name in sorted(bad):
        print(f"{name:<24}INVALID ENTRY (ignored by workers; fix it with fleet tenants add)")
    return 0


def password_sha256(args: argparse.Namespace) -> str:
    """The hex SHA-256 given, or that of the password in ``--password-env``."""
    if args.password_sha256 is not None:
        digest = args.password_sha256.strip().lower()
        if not _SHA256_RE.fullmatch(digest):
            raise ValueError("--password-sha256 takes 64 hex digits (sha256sum of the password)")
        return digest
    password = os.environ.get(args.password_env)
    if not password:
        raise ValueError(f"the environment variable {args.password_env} is not set")
    return hashlib.sha256(password.encode()).hexdigest()


def setuser_args(rule: str) -> tuple[str, list[str]]:
    """An aclfile line (``user NAME rules...``) as ACL SETUSER's user name and rules, with
    ``reset`` first: an existing user keeps no old password, key or selector."""
    tokens = _ACL_TOKEN_RE.findall(rule)
    assert tokens[0] == "user", rule
    return tokens[1], ["reset", *tokens[2:]]


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (credentials, TLS options) pointed at another node."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{auth}@{address}" if auth else address))


def apply_rule(url: str, client, rule: str) -> list[tuple[str, Exception | None]]:
    """ACL SETUSER on the server, or on every node of a cluster -- masters and replicas,
    as CLUSTER NODES lists them (CLUSTER SLOTS leaves out replicas that have not synced
    yet); per node, ``host:port (role)`` and the error where it failed."""
    name, rules = setuser_args(rule)
    if not connect.is_cluster(client):
        client.execute_command("ACL", "SETUSER", name, *rules)
        return [("the server", None)]
    # Each node reached adds the nodes it knows: one that joined a moment ago and is not yet in
    # every view (gossip) still gets the user.
    known = _reachable_nodes(client.cluster_nodes())
    done, visited = [], set()
    while pending := sorted(set(known) - visited):
        address = pending[0]
        visited.add(address)
        host, _, port = address.rpartition(":")
        role = "master" if "master" in known[address]["flags"].split(",") else "replica"
        try:
            with redis.Redis.from_url(node_url(url, host, int(port)), socket_timeout=5,
                                      socket_connect_timeout=5) as node:
                node.execute_command("ACL", "SETUSER", name, *rules)
                for other, info in _reachable_nodes(node.cluster("nodes")).items():
                    known.setdefault(other, info)
            done.append((f"{address} ({role})", None))
        except redis.RedisError as exc:
            done.append((f"{address} ({role})", exc))
    return done


def _reachable_nodes(view: dict) -> dict:
    """CLUSTER NODES entries that name an address (not ``noaddr``, not port 0)."""
    return {address: info for address, info in view.items()
            if "noaddr" not in info.get("flags", "") and not address.endswith(":0")}


def run_acl(args: argparse.Namespace) -> int:
    try:
        digest = password_sha256(args)
    except ValueError as exc:
        _note(str(exc))
        return 2
    client = connect.sync_client(args.redis_url)
    try:
        found, _, _ = _registry(client)
        if args.name not in found:
            _note(f"no tenant {args.name!r} is registered (fleet tenants add {args.name})")
            return 1
        rule = tenants.acl_user(found[args.name], digest, model=args.model)
        print(rule)
        if args.apply:
            results = apply_rule(args.redis_url, client, rule)
            for where, error in results:
                _note(f"applied on {where}" if error is None else f"NOT applied on {where}: {error}")
            if any(error is not None for _, error in results):
                _note("run it again once every node answers: a node without the user refuses "
                      "the tenant when it serves the tenant's slot")
                return 1
            _note("not saved: where the servers load an aclfile, ACL SAVE on every node keeps "
                  "this user across restarts (or add the line above to the file you deploy); "
                  "which one is your choice")
    finally:
        client.close()
    return 0
