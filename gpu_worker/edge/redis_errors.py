"""Every error Redis can answer, sorted into the few classes the worker acts on.

The worker never ends on a Redis error. What it does per class:

- ``TRANSIENT``: connection lost, timeout, LOADING, TRYAGAIN, BUSY, failover
  (READONLY, MASTERDOWN, CLUSTERDOWN): back off and retry.
- ``MISSING``: NOGROUP, or UNBLOCKED (the stream was deleted under a blocked read):
  recreate the stream's group from id 0 and carry on.
- ``DENIED``: NOPERM, NOAUTH, WRONGPASS: log once, report not ready, retry slowly (an
  operator has to fix the ACL; the worker picks up as soon as it works).
- ``OOM``: the server refuses writes. Stop reading new work, keep finishing (retrying the
  writes) and acknowledging; reported as a metric and not ready.
- ``REDIRECT``: MOVED/ASK/CROSSSLOT left over after the cluster client's own redirects and
  retries (slots moving for longer than they take, a proxy hiding the nodes): a clear
  error, not ready, retry slowly.
- ``REQUEST``: an error about one call's own keys or values (WRONGTYPE after a client
  wrote a request's key, a script error): that request alone ends.
"""
from __future__ import annotations

import enum

from redis import exceptions as rx


class Kind(enum.Enum):
    TRANSIENT = "transient"
    MISSING = "missing"
    DENIED = "denied"
    OOM = "oom"
    REDIRECT = "redirect"
    REQUEST = "request"


# The classes redis-py raises for a reply's prefix (it strips the prefix from the message).
_BY_CLASS: tuple[tuple[tuple[type, ...], Kind], ...] = (
    ((rx.OutOfMemoryError,), Kind.OOM),
    ((rx.NoPermissionError, rx.AuthenticationError, rx.AuthorizationError), Kind.DENIED),
    ((rx.AskError, rx.ClusterCrossSlotError), Kind.REDIRECT),  # a MovedError is an AskError
    # (a MasterDownError is a ClusterDownError; the builtin ConnectionError and TimeoutError are OSErrors)
    ((rx.BusyLoadingError, rx.ReadOnlyError, rx.TryAgainError, rx.ClusterDownError, rx.ConnectionError,
      rx.TimeoutError, OSError), Kind.TRANSIENT),
)
# Prefixes redis-py has no class for, left in a plain ResponseError's message.
_BY_PREFIX = (("NOGROUP", Kind.MISSING), ("UNBLOCKED", Kind.MISSING), ("BUSY", Kind.TRANSIENT))


def classify(exc: BaseException) -> Kind:
    """The class of ``exc``; anything unknown is ``REQUEST`` (it ends one call only)."""
    kind = next((k for cls, k in _BY_CLASS if isinstance(exc, cls)), None)
    if kind is not None:
        return kind
    message = str(exc).lstrip()
    return next((k for prefix, k in _BY_PREFIX if message.startswith(prefix)), Kind.REQUEST)
