"""Which failures are the client's and which are the fleet's: rejections vs dead letters.

A *rejection* is a typed validation failure of one request (``empty_prompt``,
``prompt_too_long``, ``invalid_token_id``, ``tenant_mismatch``, ...): the client is told,
nothing is wrong with the fleet, it is counted by code (``fleet:requests_rejected_total``)
and never pages. A *dead letter* is an entry the fleet could not serve at all: undecodable
(``malformed``, ``too_large``, ``too_deep``, ``unsupported_version``), delivered too often
without finishing (``poison``), or failed inside the engine (``internal``). Only those go to
the dead-letter stream, counted by ``reason`` (``fleet:requests_dead_lettered_total``); they
page (``FleetDeadLetters``).

Every code not listed below is a rejection, so a validation code added later never pages.
"""
from __future__ import annotations

from shared import errors

# dead-letter code -> reason (the metric's label, the alert's label)
DEAD_LETTER_REASONS: dict[str, str] = {
    errors.POISON: "poison",
    errors.MALFORMED: "malformed",
    errors.TOO_LARGE: "malformed",
    errors.TOO_DEEP: "malformed",
    errors.UNSUPPORTED_VERSION: "malformed",
    errors.INTERNAL: "internal",
}
REASONS = ("poison", "malformed", "internal")


def is_rejection(code: str | None) -> bool:
    """True for a client's validation failure (told to the client, not dead-lettered)."""
    return code is not None and code not in DEAD_LETTER_REASONS


def dead_letter_reason(code: str | None) -> str:
    """The reason label of a dead letter with this code (``internal`` if unknown)."""
    return DEAD_LETTER_REASONS.get(code or "", "internal")
