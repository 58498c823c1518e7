"""One request's grammar matcher: fed every output token, rolled back after draft checks."""
from __future__ import annotations

import itertools


class GrammarState:
    """Wraps an ``xgrammar.GrammarMatcher`` (unlimited rollback) over a compiled grammar."""

    def __init__(self, compiled) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar refuses it."""
        return bool(self.matcher.accept_token(int(token_id)))

    def feed(self, token_ids: list[int]) -> bool:
        """Advance by every token (a resumed or recomputed output); False at the first refused."""
        return all(self.accept(t) for t in token_ids)

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many leading tokens the grammar accepts from here; the state is left as it was."""
        n = sum(1 for _ in itertools.takewhile(self.accept, token_ids))
        self.rollback(n)
        return n

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def fill(self, bitmask, index: int) -> None:
        """The allowed next tokens into row ``index`` of an xgrammar bitmask."""
        self.matcher.fill_next_token_bitmask(bitmask, index)

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())
