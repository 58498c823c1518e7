"""A synthetic engine for ``fleet bench edge``: no model, tokens at a set rate.

It has the interface :class:`~gpu_worker.edge.engine_loop.EngineThread` drives, so the
real worker serves it unchanged. Every ``step_s`` each running request (at most
``max_num_seqs``) gets ``tokens_per_step`` tokens; token ``p`` of a request is a pure
function of its prompt (:func:`expected_tokens`), so a client can check every token it
receives. A token's text is the time it was emitted (:func:`stamp`, 4 characters, about a
real token's length), so a client can also tell how late it received it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from gpu_worker.outputs import RequestDelta

VOCAB_SIZE = 32_000
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
STAMP_MODULUS_MS = len(_DIGITS) ** 4  # about 28 minutes: latencies are far below it


def expected_tokens(prompt_ids: list[int], start: int, end: int) -> list[int]:
    """Tokens ``[start, end)`` the synthetic engine emits for ``prompt_ids``."""
    base = prompt_ids[0] * 7919
    return [(base + 31 * p) % VOCAB_SIZE for p in range(start, end)]


def stamp(now_s: float) -> str:
    """``now_s`` in milliseconds modulo :data:`STAMP_MODULUS_MS`, 4 base-36 digits."""
    ms = int(now_s * 1000) % STAMP_MODULUS_MS
    out = []
    for _ in range(4):
        ms, d = divmod(ms, len(_DIGITS))
        out.append(_DIGITS[d])
    return "".join(reversed(out))


def age_ms(text: str, now_s: float) -> list[int]:
    """How many milliseconds ago each 4-character stamp in ``text`` was taken."""
    now_ms = int(now_s * 1000) % STAMP_MODULUS_MS
    return [(now_ms - int(text[i:i + 4], 36)) % STAMP_MODULUS_MS for i in range(0, len(text), 4)]


class _Tokenizer:
    """Prompts arrive as token ids; this only stands in for the engine's tokenizer."""

    def encode(self, text: str) -> list[int]:
        return [1 + b for b in text.encode()][:64] or [1]

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.encode(" ".join(m["content"] for m in messages))


@dataclass
class _Running:
    prompt_ids: list[int]
    max_tokens: int
    num_output: int
    aborted: str | None = None


class SyntheticEngine:
    """Decodes ``tokens_per_step`` tokens per running request every ``step_s`` seconds."""

    def __init__(self, *, max_num_seqs: int, step_s: float, tokens_per_step: int = 1) -> None:
        self.max_num_seqs, self.step_s, self.tokens_per_step = max_num_seqs, step_s, tokens_per_step
        self.vocab_size = VOCAB_SIZE
        self.tokenizer = _Tokenizer()
        self._running: dict[str, _Running] = {}
        self._next_step = time.monotonic()
        self.num_steps = 0

    def add_request(self, request_id: str, prompt_token_ids, params, *, priority: int = 0,
                    resume_token_ids=(), deadline: float | None = None) -> None:
        self._running[request_id] = _Running(list(prompt_token_ids), params.max_tokens,
                                             len(resume_token_ids))

    def abort_request(self, request_id: str, reason: str = "cancelled") -> bool:
        r = self._running.get(request_id)
        if r is not None:
            r.aborted = reason
        return r is not None

    def can_admit(self, num_prompt_tokens: int, max_tokens: int) -> bool:
        return len(self._running) < self.max_num_seqs

    def has_unfinished_requests(self) -> bool:
        return bool(self._running)

    def unfinished_request_ids(self) -> list[str]:
        return list(self._running)

    def step(self) -> list[RequestDelta]:
        """Wait for the next tick (a late step is not made up for, as on a GPU), then emit."""
        now = time.monotonic()
        if now < self._next_step:
            time.sleep(self._next_step - now)
        self._next_step = max(self._next_step + self.step_s, time.monotonic())
        self.num_steps += 1
        text = stamp(time.time())
        deltas = []
        for key, r in list(self._running.items()):
            deltas.append(self._advance(key, r, text))
        return deltas

    def _advance(self, key: str, r: _Running, text: str) -> RequestDelta:
        if r.aborted is not None:
            del self._running[key]
            return RequestDelta(request_id=key, new_token_ids=[], new_text="", finished=True,
                                finish_reason=r.aborted, num_output_tokens=r.num_output)
        n = min(self.tokens_per_step, r.max_tokens - r.num_output)
        start = r.num_output
        r.num_output += n
        ids = expected_tokens(r.prompt_ids, start, r.num_output)
        finished = r.num_output >= r.max_tokens
        if finished:
            del self._running[key]
        return RequestDelta(request_id=key, new_token_ids=ids, new_text=text * n,
                            finished=finished, finish_reason="length" if finished else None,
                            num_prompt_tokens=len(r.prompt_ids), num_output_tokens=r.num_output)

    def stats(self) -> dict:
        return {"num_running": len(self._running), "num_waiting": 0, "kv_usage": 0.0,
                "num_free_blocks": self.max_num_seqs - len(self._running),
                "num_total_blocks": self.max_num_seqs}
