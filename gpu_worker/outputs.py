"""What the engine hands back after each step."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one sampled token and, if asked for, the top-n alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(kw_only=True)
class RequestDelta:
    """What one request produced in one engine step.

    ``new_token_ids`` may hold several tokens (speculative decoding). ``new_text`` is the
    text those tokens completed (a stop string is never included). When ``finished`` is
    true, ``finish_reason`` is one of ``stop``, ``length``, ``cancelled``, ``timeout``,
    ``error`` and no later delta comes for this request.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None
    index: int = 0                      # the sample of a request with n > 1 (gpu_worker.fork)


@dataclass(kw_only=True)
class CompletionOutput:
    """The whole result of one prompt from the offline API. ``finish_reason == "error"``:
    the engine failed this request alone; ``error_code``/``error_message`` say why."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None
    index: int = 0
    choices: list["CompletionOutput"] = field(default_factory=list)   # all n samples when n > 1
