"""Every Redis key and channel name of the fleet, in one place.

Streams and worker keys are per model (``model`` is the worker's ``--model-name``). Each
tenant has its own request stream per lane, all under the hash tag ``{tenant}``: one
XREADGROUP reads a tenant's lanes, a cluster spreads tenants over slots, and an ACL
pattern gives each tenant its own streams only. The keys of one request are derived from
its tenant and request id only -- a payload never picks where output goes -- and share one
hash tag ``{tenant/request_id}``, so a request's scripts touch a single Redis Cluster slot.
"""
from __future__ import annotations

import re

from shared import limits as L

PREFIX = "fleet"
LANES = ("high", "default", "batch")  # served strictly in this order
GROUP = "workers"  # the one consumer group of every request stream
HANDOFF_CONSUMER = "handoff"  # holds entries a draining worker gave back
STREAM_FIELD = "data"  # the stream-entry field that carries the request JSON

_MODEL_RE = re.compile(L.MODEL_NAME_PATTERN)
_ID_RE = re.compile(L.REQUEST_ID_PATTERN)
_TENANT_RE = re.compile(L.TENANT_PATTERN)


def check_model(model: str) -> str:
    if not _MODEL_RE.match(model):
        raise ValueError(f"invalid model name {model!r}")
    return model


DEFAULT_TENANT = "default"


def check_tenant(tenant: str) -> str:
    if not _TENANT_RE.match(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}")
    return tenant


def check_lane(lane: str) -> str:
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}; expected one of {LANES}")
    return lane


def tenant_tag(tenant: str) -> str:
    return "{" + check_tenant(tenant) + "}"


def stream_key(model: str, tenant: str, lane: str) -> str:
    """One tenant's request stream of one priority lane."""
    return f"{PREFIX}:{check_model(model)}:requests:{tenant_tag(tenant)}:{check_lane(lane)}"


def stream_pattern(model: str, tenant: str) -> str:
    """The ACL key pattern of every request stream of a tenant (any lane)."""
    return f"{PREFIX}:{model}:requests:{tenant_tag(tenant)}:*"


def legacy_stream_key(model: str, lane: str) -> str:
    """The stream every tenant shared before per-tenant streams (drained after an upgrade;
    nothing new is written there)."""
    return f"{PREFIX}:{check_model(model)}:requests:{check_lane(lane)}"


def tenants_key() -> str:
    """Hash: tenant name -> its :class:`~shared.tenants.TenantConfig` JSON (every model)."""
    return f"{PREFIX}:tenants"


def dead_letter_key(model: str) -> str:
    return f"{PREFIX}:{check_model(model)}:dead"


def control_channel(model: str) -> str:
    """Broadcast channel to every worker of a model (cancel notices)."""
    return f"{PREFIX}:{check_model(model)}:control"


def workers_key(model: str) -> str:
    """Sorted set: worker id -> last heartbeat (Unix seconds)."""
    return f"{PREFIX}:{check_model(model)}:workers"


def worker_key(model: str, worker_id: str) -> str:
    """Hash with a TTL: one worker's status (running, waiting, KV usage, ...)."""
    return f"{PREFIX}:{check_model(model)}:worker:{worker_id}"


def request_tag(tenant: str, request_id: str) -> str:
    if not _TENANT_RE.match(tenant) or not _ID_RE.match(request_id):
        raise ValueError(f"invalid tenant/request id {tenant!r}/{request_id!r}")
    return "{" + tenant + "/" + request_id + "}"


def state_key(tenant: str, request_id: str) -> str:
    """Hash: owner/fence/entry while running; ``result`` (terminal event JSON) when done."""
    return f"{PREFIX}:req:{request_tag(tenant, request_id)}:state"


def progress_key(tenant: str, request_id: str) -> str:
    """List: every published :class:`~shared.protocol.Token` event JSON, in order."""
    return f"{PREFIX}:req:{request_tag(tenant, request_id)}:progress"


def cancel_key(tenant: str, request_id: str) -> str:
    """String: present when the client asked to cancel."""
    return f"{PREFIX}:req:{request_tag(tenant, request_id)}:cancel"


def channel(tenant: str, request_id: str) -> str:
    """Pub/sub channel of one request's events (sharded pub/sub on a cluster)."""
    return f"{PREFIX}:req:{request_tag(tenant, request_id)}:events"


def request_keys(tenant: str, request_id: str) -> list[str]:
    """The KEYS of every per-request script, in the order the scripts expect."""
    return [state_key(tenant, request_id), progress_key(tenant, request_id),
            cancel_key(tenant, request_id), channel(tenant, request_id)]


# The gateway's OpenAI Files and Batches (``/v1/files``, ``/v1/batches``): all of one tenant's
# under its hash tag, so each script and transaction stays in one Redis Cluster slot.
_OBJECT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$(?!\n)")


def _object_id(object_id: str) -> str:
    if not _OBJECT_ID_RE.match(object_id):
        raise ValueError(f"invalid file or batch id {object_id!r}")
    return object_id


def files_key(tenant: str) -> str:
    """Sorted set: a tenant's file ids by creation time."""
    return f"{PREFIX}:files:{tenant_tag(tenant)}"


def file_key(tenant: str, file_id: str, part: str = "meta") -> str:
    """``meta``: string, the file object JSON; ``lines``: list, the file's lines (TTL both)."""
    return f"{PREFIX}:files:{tenant_tag(tenant)}:{_object_id(file_id)}:{part}"


def batches_key(tenant: str) -> str:
    """Sorted set: a tenant's batch ids by creation time."""
    return f"{PREFIX}:batches:{tenant_tag(tenant)}"


def active_batches_key(tenant: str) -> str:
    """Set: the tenant's batches not yet finished (what a gateway's runner picks up)."""
    return f"{PREFIX}:batches:{tenant_tag(tenant)}:active"


def batch_key(tenant: str, batch_id: str, part: str = "state") -> str:
    """``state``: hash (status, counts, times, the batch's fixed fields); ``done``: set of
    the input line numbers answered; ``lease``: string, the runner that holds the batch."""
    return f"{PREFIX}:batches:{tenant_tag(tenant)}:{_object_id(batch_id)}:{part}"
