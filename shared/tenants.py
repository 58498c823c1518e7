"""Tenants: who may enqueue, into which lanes, with what share of a worker.

The registry is one Redis hash (:func:`shared.keys.tenants_key`): tenant name -> the JSON
of its :class:`TenantConfig`. Operators manage it with ``fleet tenants``; workers re-read
it every few seconds, so a tenant added or removed needs no restart. With no tenant
registered at all, the fleet serves the one implicit tenant ``default`` on every lane
(a single-team setup needs no configuration).
"""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct, field

from shared import keys
from shared import limits as L
from shared.protocol import Lane

Tenant = Annotated[str, Meta(pattern=L.TENANT_PATTERN)]

# What every fleet user needs to connect (cluster discovery, redirects, key parsing).
CONNECT_COMMANDS = ("+ping", "+hello", "+info", "+command", "+asking", "+readonly",
                    "+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info")


class TenantConfig(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One tenant's entry in the registry.

    lanes: the lanes it may enqueue into (its ACL user can write only those streams).
    weight: its share of a worker's free KV blocks within a lane, relative to the other
        tenants with work waiting there (fair share; lanes themselves stay strict priority).
    max_running: the most requests of this tenant one worker runs at once (None: no cap).
    """

    name: Tenant
    lanes: Annotated[list[Lane], Meta(min_length=1, max_length=3)] = field(
        default_factory=lambda: ["default", "batch"])
    weight: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    max_running: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None

    def __post_init__(self) -> None:
        if len(set(self.lanes)) != len(self.lanes):
            raise ValueError("lanes must not repeat")


IMPLICIT_DEFAULT = TenantConfig(name=keys.DEFAULT_TENANT, lanes=list(keys.LANES))

_decoder = msgspec.json.Decoder(TenantConfig)


def encode(config: TenantConfig) -> bytes:
    return msgspec.json.encode(config)


def decode(raw: bytes | str) -> TenantConfig:
    """A registry entry; raises ``msgspec.ValidationError``/``DecodeError`` if invalid."""
    return _decoder.decode(raw)


def parse_registry(raw: dict) -> tuple[dict[str, TenantConfig], list[str]]:
    """The tenants of a registry hash (HGETALL reply), and the names of invalid entries
    (skipped: one bad entry must not stop every tenant). Empty registry: the implicit
    ``default`` tenant."""
    found, bad = {}, []
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else name
        try:
            config = decode(value)
        except (msgspec.ValidationError, msgspec.DecodeError):
            bad.append(name)
            continue
        if config.name != name:
            bad.append(name)
            continue
        found[name] = config
    if not raw:
        found[keys.DEFAULT_TENANT] = IMPLICIT_DEFAULT
    return found, bad


def acl_user(config: TenantConfig, password_sha256: str, *, model: str = "*") -> str:
    """The ACL rule of a tenant's Redis user ``tenant-<name>``: it may XADD (and XLEN) its
    own streams of its allowed lanes, read its own requests' keys and channels, and set
    their cancel keys; nothing else. Trimming or blocking a stream hurts only its owner."""
    name = config.name
    streams = " ".join(f"~{keys.PREFIX}:{model}:requests:{keys.tenant_tag(name)}:{lane}"
                       for lane in config.lanes)
    own = f"{keys.PREFIX}:req:{{{name}/*"
    return " ".join([
        f"user tenant-{name} on #{password_sha256} resetkeys resetchannels -@all",
        *CONNECT_COMMANDS,
        "+hget +lrange +subscribe +unsubscribe +ssubscribe +sunsubscribe",
        f"%R~{own} &{own}",
        f"({streams} +xadd +xlen)",
        f"(~{keys.PREFIX}:req:{{{name}/*}}:cancel +set)",
    ])
