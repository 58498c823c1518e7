"""Reading a :class:`~shared.protocol.Result` the same way for any ``n``."""
from __future__ import annotations

from shared.protocol import Choice, Result


def all_choices(result: Result) -> list[Choice]:
    """Every choice of a result, in index order (choice 0 alone when the request had
    ``n == 1``: its top-level fields)."""
    return result.choices or [Choice(index=0, finish_reason=result.finish_reason,
                                     stop_reason=result.stop_reason, text=result.text,
                                     token_ids=result.token_ids)]
