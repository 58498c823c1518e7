"""One choice (sample) of a held request: what earlier workers delivered, what this worker
generated, what it holds unpublished, and how the choice ended. A request with ``n == 1``
has one, index 0, and its events are exactly those of before choices existed."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import msgspec

from gpu_worker.outputs import RequestDelta
from shared import codec
from shared.protocol import Choice, Token, TokenLogprob

logger = logging.getLogger(__name__)
_choice_decoder = msgspec.json.Decoder(Choice)


def decode_choice(raw: bytes | str) -> Choice:
    """A choice's end as BEGIN read it back (stored by END_CHOICE)."""
    return _choice_decoder.decode(raw)


@dataclass(kw_only=True)
class ChoiceState:
    index: int
    prior_token_ids: list[int]  # delivered by earlier workers (resume)
    prior_text: str
    token_ids: list[int] = field(default_factory=list)  # generated here
    text_parts: list[str] = field(default_factory=list)
    # Recorded but not yet published (coalescing): the last ``len(held_ids)`` of token_ids.
    held_ids: list[int] = field(default_factory=list)
    held_text: list[str] = field(default_factory=list)
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    ended: Choice | None = None  # set once the choice ended (here or, stored, by an earlier worker)

    @property
    def num_tokens(self) -> int:
        return len(self.prior_token_ids) + len(self.token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prior_token_ids + self.token_ids

    @property
    def text(self) -> str:
        return self.prior_text + "".join(self.text_parts)

    def record(self, delta: RequestDelta) -> None:
        """Take this step's new tokens; they are held until :meth:`take_event`."""
        if not delta.new_token_ids:
            if delta.new_text:  # text released at the end (held back for a stop string)
                self.text_parts.append(delta.new_text)
            return
        seq = delta.num_output_tokens - len(delta.new_token_ids)
        assert seq == self.num_tokens, "token sequence broken"
        self.token_ids.extend(delta.new_token_ids)
        self.text_parts.append(delta.new_text)
        self.held_ids.extend(delta.new_token_ids)
        self.held_text.append(delta.new_text)
        if delta.logprobs is not None:
            self.held_logprobs.extend(
                TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top=[tuple(t) for t in lp.top])
                for lp in delta.logprobs)

    def take_event(self, request_id: str) -> Token | None:
        """One event for every token held, ``[seq, seq + k)`` of this choice, or None."""
        if not self.held_ids:
            return None
        event = Token(request_id=request_id, seq=self.num_tokens - len(self.held_ids),
                      token_ids=self.held_ids, text="".join(self.held_text),
                      logprobs=self.held_logprobs or None, index=self.index)
        self.held_ids, self.held_text, self.held_logprobs = [], [], []
        return event

    def end(self, finish_reason: str, stop_reason: str | int | None) -> Choice:
        self.ended = Choice(index=self.index, finish_reason=finish_reason, stop_reason=stop_reason,
                            text=self.text, token_ids=self.all_token_ids)
        return self.ended


def resume_choices(events: list[bytes], n: int) -> list[tuple[list[int], str]]:
    """Each choice's tokens and text already delivered, from the stored progress list.

    Per choice, events tile ``[0, k)`` by ``seq``; a copy appended twice (a retried write)
    is skipped; a choice resumes from the first gap in its events.
    """
    token_ids: list[list[int]] = [[] for _ in range(n)]
    text: list[list[str]] = [[] for _ in range(n)]
    broken: set[int] = set()
    for raw in events:
        event = codec.decode_token(raw)
        i = event.index
        if i >= n or i in broken:
            continue
        end = event.seq + len(event.token_ids)
        if end <= len(token_ids[i]):
            continue
        if event.seq != len(token_ids[i]):
            logger.error("progress of %s choice %d has a gap at %d; resuming from there",
                         event.request_id, i, len(token_ids[i]))
            broken.add(i)
            continue
        token_ids[i].extend(event.token_ids)
        text[i].append(event.text)
    return [(ids, "".join(parts)) for ids, parts in zip(token_ids, text)]
