"""Mutable per-request state, owned by the scheduler, and the one place requests are made
from client input (:class:`RequestFactory`, shared by the engine and the pipeline)."""
from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.errors import InvalidRequestError
from gpu_worker.outputs import RequestDelta, TokenLogprob
from gpu_worker.sampling_params import SamplingParams

if TYPE_CHECKING:
    from gpu_worker.structured.compiler import GrammarCompiler, PendingGrammar
    from gpu_worker.structured.state import GrammarState


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False, kw_only=True)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    eos_token_ids: tuple[int, ...]
    max_total_tokens: int               # prompt + output may not pass this (model context)
    priority: int = 0                   # lower runs first
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None       # time.time() epoch seconds

    output_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)   # prompt + output
    spec_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1         # prefix-cache hit at first schedule; -1 = not yet
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error_code: str | None = None       # set with finish_reason "error"
    error_message: str | None = None
    num_preemptions: int = 0
    # Structured output: compiling (pending) until the scheduler first admits it, then the
    # matcher, fed every output token (resumed ones first).
    grammar_pending: PendingGrammar | None = None
    grammar: GrammarState | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def max_output_tokens(self) -> int:
        return min(self.params.max_tokens, self.max_total_tokens - self.num_prompt_tokens)

    @property
    def is_decoding(self) -> bool:
        """Running with every token but the last computed: its next step feeds one token."""
        return self.status is Status.RUNNING and self.num_computed_tokens == self.num_tokens - 1

    @property
    def max_num_drafts(self) -> int:
        """Drafts worth verifying next step: one output slot is left for the bonus token."""
        return max(0, self.max_output_tokens - self.num_output_tokens - 1)

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

    def take_delta(self, new_token_ids: list[int], logprobs: list[TokenLogprob] | None = None) -> RequestDelta:
        """What the request produced since its last delta (final once it is finished)."""
        final = self.is_finished
        failed = self.finish_reason == "error"   # its detokenizer may be what failed: no text
        return RequestDelta(
            request_id=self.request_id, new_token_ids=new_token_ids,
            new_text="" if failed else self.detokenizer.take(final=final), finished=final,
            finish_reason=self.finish_reason if final else None, stop_reason=self.stop_reason if final else None,
            logprobs=logprobs, num_prompt_tokens=self.num_prompt_tokens, num_output_tokens=self.num_output_tokens,
            num_cached_tokens=max(self.num_cached_tokens, 0), error_code=self.error_code,
            error_message=self.error_message)


@dataclass(frozen=True)
class RequestFactory:
    """Validates client input against one model and KV cache and makes the Request."""

    tokenizer: object                   # a Tokenizer: detokenizes the outputs
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    max_model_len: int
    max_kv_tokens: int                  # tokens the whole KV cache holds
    grammars: GrammarCompiler | None = None   # compiles structured outputs (None: refused)

    def make(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, *,
             priority: int = 0, resume_token_ids: Sequence[int] = (), deadline: float | None = None) -> Request:
        """A request ready to queue; raises :class:`InvalidRequestError` (with a stable
        ``code``) for input that could never run here."""
        prompt, resumed = list(prompt_token_ids), list(resume_token_ids)
        self._validate(prompt, resumed, params)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        detok.prime(resumed)   # the text of tokens already delivered is not handed out again
        pending = None
        if params.structured is not None:
            if self.grammars is None:
                raise InvalidRequestError("invalid_grammar", "this engine has no grammar compiler")
            pending = self.grammars.submit(params.structured)   # compiles off this thread
        return Request(request_id=request_id, prompt_token_ids=prompt, params=params, detokenizer=detok,
                       eos_token_ids=self.eos_token_ids, max_total_tokens=self.max_model_len,
                       priority=priority, deadline=deadline, output_token_ids=resumed,
                       grammar_pending=pending)

    def _validate(self, prompt: list[int], resumed: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("invalid_params", "params must be a SamplingParams")
        if not prompt:
            raise InvalidRequestError("empty_prompt", "the prompt has no tokens")
        params.validate(self.vocab_size)
        if len(prompt) + len(resumed) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt_too_long", f"prompt of {len(prompt) + len(resumed)} tokens does not fit the "
                f"model's context of {self.max_model_len} tokens (one token must remain to generate)")
        bad = next((t for t in prompt + resumed if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError("invalid_token_id", f"token id {bad!r} is outside [0, {self.vocab_size})")
        if len(resumed) >= params.max_tokens:
            raise InvalidRequestError("invalid_resume", "resumed tokens already reach max_tokens")
        total = len(prompt) + min(params.max_tokens, self.max_model_len - len(prompt))
        if total > self.max_kv_tokens:
            raise InvalidRequestError("exceeds_kv_cache", f"{total} tokens can never fit this worker's KV cache")
