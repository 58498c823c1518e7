"""Typed errors of the client library."""
from __future__ import annotations

from shared.protocol import Failure


class FleetError(Exception):
    """Base class of the client's errors."""


class RequestFailed(FleetError):
    """The fleet ended the request with a typed :class:`~shared.protocol.Failure`."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure
        self.code = failure.code


class PayloadTooLarge(FleetError, ValueError):
    """The encoded request is over the fleet's payload limit; nothing was enqueued."""

    def __init__(self, num_bytes: int) -> None:
        from shared import limits

        super().__init__(f"the request is {num_bytes} bytes as a fleet request; the fleet "
                         f"accepts at most {limits.MAX_PAYLOAD_BYTES}")
        self.num_bytes = num_bytes


class IdConflict(RequestFailed):
    """The request id is taken by a different request (code ``id_conflict``): nothing of
    the other request's answer was delivered. Use a fresh id for a different request."""


def failure_error(failure: Failure) -> RequestFailed:
    """The typed error for a failure: :class:`IdConflict` for ``id_conflict``."""
    return IdConflict(failure) if failure.code == "id_conflict" else RequestFailed(failure)
