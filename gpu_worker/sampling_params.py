"""Per-request sampling parameters and their validation."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_worker.errors import InvalidRequestError
from gpu_worker.structured.spec import StructuredSpec

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20
MAX_TEMPERATURE = 100.0
MAX_REPETITION_PENALTY = 100.0  # and at least its inverse: logits stay finite in float32
GREEDY_TEMPERATURE = 1e-5  # below this, sampling is argmax


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples. ``temperature == 0`` (or below ``GREEDY_TEMPERATURE``) means greedy.

    ``logprobs=None`` returns no logprobs; ``0`` the sampled token's; ``n`` that plus the
    top ``n``. Logprobs are of the model's raw distribution (before temperature, penalties
    and a grammar's mask). ``structured``: the output must match it (a grammar; the
    request ends when the grammar does, so ``min_tokens`` does not hold EOS back). ``seed`` makes sampling a pure function of (seed, position), so the same
    seed gives the same output whatever else is batched, and after preemption.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    logprobs: int | None = None
    speculative: bool = True
    structured: StructuredSpec | None = None

    def __post_init__(self) -> None:
        # Accept lists from callers; store tuples so the object stays hashable and frozen.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        # A temperature this small would scale float32 logits to inf; its limit is argmax.
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def validate(self, vocab_size: int) -> None:
        """Raise :class:`InvalidRequestError` unless every field is one the sampler's
        float32/int64 math takes. ``top_k`` at or beyond the vocabulary means no top-k."""
        _check(_int(self.max_tokens) and self.max_tokens >= 1,
               "invalid_max_tokens", f"max_tokens must be >= 1, got {self.max_tokens!r}")
        _check(_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
               "invalid_min_tokens", f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}")
        _check(_finite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE, "invalid_temperature",
               f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}")
        _check(_int(self.top_k) and self.top_k >= 0,
               "invalid_top_k", f"top_k must be >= 0 (0 disables), got {self.top_k!r}")
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0,
               "invalid_top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(_finite(self.min_p) and 0.0 <= self.min_p <= 1.0,
               "invalid_min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        low, high = 1.0 / MAX_REPETITION_PENALTY, MAX_REPETITION_PENALTY
        _check(_finite(self.repetition_penalty) and low <= self.repetition_penalty <= high,
               "invalid_repetition_penalty",
               f"repetition_penalty must be in [{low:g}, {high:g}], got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2.0 <= value <= 2.0,
                   f"invalid_{name}", f"{name} must be in [-2, 2], got {value!r}")
        # The sampler seeds a torch.Generator from it: an int64 (row_seed keeps it below 2**63).
        _check(self.seed is None or (_int(self.seed) and 0 <= self.seed < 2**63),
               "invalid_seed", f"seed must be a non-negative 63-bit integer, got {self.seed!r}")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "too_many_stop_strings",
               f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            _check(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS, "invalid_stop",
                   f"each stop string must have 1..{MAX_STOP_STRING_CHARS} characters")
        _check(len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "too_many_stop_token_ids",
               f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got {len(self.stop_token_ids)}")
        for t in self.stop_token_ids:
            _check(_int(t) and 0 <= t < vocab_size, "invalid_stop_token_id",
                   f"stop token id {t!r} is outside the vocabulary [0, {vocab_size})")
        _check(self.logprobs is None or (_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
               "invalid_logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.structured is not None:
            _check(isinstance(self.structured, StructuredSpec), "invalid_grammar",
                   "structured must be a StructuredSpec")
            self.structured.validate()
            _check(not self.ignore_eos, "invalid_grammar", "ignore_eos cannot be set with structured "
                   "output (the grammar decides where the output ends)")


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, code: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(code, message)
