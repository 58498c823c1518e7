"""The digest of a request: what makes two submissions under one id the same request.

Every field that can change the answer counts: the prompt (in whichever form), every
sampling field, ``n``, ``logprobs``, ``speculative``, ``v`` and any field added later.
What a retry of the same request may change does not: ``tenant`` (the stream names it),
``priority`` (the lane), ``deadline``, ``submitted_at`` and ``metadata``. The digest is the
SHA-256 of the request's canonical encoding (this module's encoder, fields in declaration
order, defaults written out) with those fields reset to their defaults.
"""
from __future__ import annotations

import hashlib

import msgspec

from shared import codec
from shared.protocol import Request

IGNORED_FIELDS = ("tenant", "priority", "deadline", "submitted_at", "metadata")


def request_digest(request: Request) -> str:
    """32 hex digits; equal for two requests exactly when they are the same request."""
    canonical = msgspec.structs.replace(request, tenant=None, priority="default", deadline=None,
                                        submitted_at=None, metadata={})
    return hashlib.sha256(codec.encode(canonical)).hexdigest()[:32]
