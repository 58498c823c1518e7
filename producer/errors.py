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
