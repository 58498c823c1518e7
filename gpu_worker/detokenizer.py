"""Incremental detokenization with stop strings.

Text is emitted only once it is stable: a token that ends inside a multi-byte character
(decoded as U+FFFD) is held back until the next token completes it. Stop strings are
searched in the new text plus enough of the old to catch one that spans a boundary; the
stop string itself is never emitted.
"""
from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: Sequence[str] = (), skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._special = tokenizer.all_special_ids if skip_special_tokens else set()
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""          # all stable text so far (before any stop string)
        self._emitted = 0       # characters of ``text`` already handed out

    def prime(self, token_ids: Sequence[int]) -> None:
        """Take tokens whose text was already delivered (a resumed request)."""
        self.push(token_ids, check_stop=False)
        self._emitted = len(self.text)

    def push(self, token_ids: Sequence[int], check_stop: bool = True) -> str | None:
        """Add tokens; return the stop string if one now appears in the text (then the
        text is cut before it)."""
        for t in token_ids:
            if t in self._special:
                continue
            self._ids.append(t)
            prefix = self._tok.decode(self._ids[self._prefix_offset:self._read_offset])
            full = self._tok.decode(self._ids[self._prefix_offset:])
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                start = len(self.text)
                self.text += full[len(prefix):]
                self._prefix_offset = self._read_offset
                self._read_offset = len(self._ids)
                if check_stop and (hit := self._find_stop(start)) is not None:
                    return hit
        return None

    def _find_stop(self, new_start: int) -> str | None:
        """The stop string that appears first (the first listed on a tie), cut from the text."""
        window_start = max(new_start - self._hold, 0)
        hits = [(pos, i) for i, s in enumerate(self.stop) if (pos := self.text.find(s, window_start)) != -1]
        if not hits:
            return None
        pos, i = min(hits)
        self.text = self.text[:pos]
        return self.stop[i]

    def take(self, final: bool) -> str:
        """Text ready to hand out. While running, the last ``len(longest stop) - 1``
        characters wait, since they might begin a stop string."""
        limit = len(self.text) if final else max(len(self.text) - self._hold, self._emitted)
        out = self.text[self._emitted:limit]
        self._emitted = limit
        return out
