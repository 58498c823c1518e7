"""Typed errors raised at the engine's boundary, and the codes of requests it fails.

Every error a single request can cause is an :class:`InvalidRequestError` with a stable
``code``; the engine raises it for that request alone and keeps serving the others. A
request the engine fails while serving it ends with ``finish_reason="error"`` and
``error_code`` :data:`INTERNAL`; only :class:`EngineBrokenError` means the engine itself
cannot go on.
"""
from __future__ import annotations

from shared.errors import INTERNAL

__all__ = ["INTERNAL", "EngineBrokenError", "EngineError", "InvalidRequestError", "ModelLoadError"]


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """A request the engine refuses; ``code`` is stable and goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ModelLoadError(EngineError):
    """The model (weights, config or tokenizer) could not be loaded."""


class EngineBrokenError(EngineError):
    """Steps fail whatever the batch holds: the caller must hand every request back."""
