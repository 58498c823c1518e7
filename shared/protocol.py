"""Message types on the wire. JSON, so any language can enqueue and read.

Inbound: one :class:`Request` per stream entry (field ``data``); :class:`Cancel` on a
model's control channel. Outbound, on the
request's channel and in its durable progress: :class:`Token` events, then exactly one
terminal event, :class:`Result` or :class:`Failure`. Outbound events are a tagged union
(field ``type``).

Evolution rule: new fields go at the end with defaults; a field's type never changes; a
breaking change bumps ``v`` (workers dead-letter versions they do not know).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from msgspec import Meta, Struct

from shared import limits as L

RequestId = Annotated[str, Meta(pattern=L.REQUEST_ID_PATTERN,
                                description="Client-chosen id; the idempotency key.")]
Tenant = Annotated[str, Meta(pattern=L.TENANT_PATTERN)]
TokenId = Annotated[int, Meta(ge=0, le=L.MAX_TOKEN_ID)]
Lane = Literal["high", "default", "batch"]
NonNegFloat = Annotated[float, Meta(ge=0.0, le=L.MAX_UNIX_TIME)]


class ChatMessage(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, Meta(max_length=L.MAX_MESSAGE_CHARS)]


SpecText = Annotated[str, Meta(min_length=1, max_length=L.MAX_STRUCTURED_SPEC_CHARS)]


class StructuredJsonObject(Struct, tag="json_object", tag_field="type", kw_only=True, frozen=True,
                           forbid_unknown_fields=True):
    """The output is one JSON object (any keys)."""


class StructuredJsonSchema(Struct, tag="json_schema", tag_field="type", kw_only=True, frozen=True,
                           forbid_unknown_fields=True):
    """The output is JSON valid against ``schema`` (a JSON Schema, as a JSON object)."""

    schema: dict[str, Any]


class StructuredRegex(Struct, tag="regex", tag_field="type", kw_only=True, frozen=True,
                      forbid_unknown_fields=True):
    """The whole output matches ``pattern``."""

    pattern: SpecText


class StructuredChoice(Struct, tag="choice", tag_field="type", kw_only=True, frozen=True,
                       forbid_unknown_fields=True):
    """The output is exactly one of ``choices``."""

    choices: Annotated[list[Annotated[str, Meta(min_length=1, max_length=L.MAX_CHOICE_CHARS)]],
                       Meta(min_length=1, max_length=L.MAX_CHOICES)]


class StructuredGrammar(Struct, tag="grammar", tag_field="type", kw_only=True, frozen=True,
                        forbid_unknown_fields=True):
    """The output is a sentence of the EBNF grammar ``ebnf`` (GBNF style, rule ``root``)."""

    ebnf: SpecText


StructuredOutput = Union[StructuredJsonObject, StructuredJsonSchema, StructuredRegex,
                         StructuredChoice, StructuredGrammar]


class Request(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One generation request. Exactly one of ``prompt``, ``messages``, ``prompt_token_ids``.

    Sampling fields mean what :class:`gpu_worker.sampling_params.SamplingParams` says;
    ``temperature == 0`` is greedy. ``deadline`` is a Unix time in seconds: a request not
    started by then fails with ``timeout`` before any prefill; one running then stops.
    ``priority`` names the lane the producer enqueues into (the stream decides, not this).
    ``tenant`` may be left out: the stream a request is read from names its tenant, and a
    payload naming any other tenant fails with ``tenant_mismatch``. ``structured`` constrains
    the output (JSON object, JSON Schema, regex, choice, EBNF); a spec the worker cannot
    compile fails with ``invalid_grammar``.
    """

    v: Annotated[int, Meta(ge=1)] = L.PROTOCOL_VERSION
    request_id: RequestId
    tenant: Tenant | None = None
    prompt: Annotated[str, Meta(max_length=L.MAX_PROMPT_CHARS)] | None = None
    messages: Annotated[list[ChatMessage], Meta(max_length=L.MAX_MESSAGES)] | None = None
    prompt_token_ids: Annotated[list[TokenId], Meta(max_length=L.MAX_PROMPT_TOKENS)] | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=L.MAX_TOKENS)] = 16
    min_tokens: Annotated[int, Meta(ge=0, le=L.MAX_TOKENS)] = 0
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0, le=L.MAX_TOP_K)] = 0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    repetition_penalty: Annotated[float, Meta(ge=0.01, le=100.0)] = 1.0
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    seed: Annotated[int, Meta(ge=0, le=L.MAX_SAFE_INTEGER)] | None = None
    stop: Annotated[list[Annotated[str, Meta(min_length=1, max_length=L.MAX_STOP_STRING_CHARS)]],
                    Meta(max_length=L.MAX_STOP_STRINGS)] = []
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=L.MAX_STOP_TOKEN_IDS)] = []
    ignore_eos: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=L.MAX_LOGPROBS)] | None = None
    speculative: bool = True
    priority: Lane = "default"
    deadline: Annotated[float, Meta(gt=0.0, le=L.MAX_UNIX_TIME)] | None = None
    metadata: Annotated[dict[Annotated[str, Meta(max_length=L.MAX_METADATA_KEY_CHARS)],
                             Annotated[str, Meta(max_length=L.MAX_METADATA_VALUE_CHARS)]],
                        Meta(max_length=L.MAX_METADATA_ITEMS)] = {}
    submitted_at: NonNegFloat | None = None
    n: Annotated[int, Meta(ge=1, le=L.MAX_N,
                           description="Samples of this prompt (choices), sharing its KV.")] = 1
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        given = [x is not None for x in (self.prompt, self.messages, self.prompt_token_ids)]
        if sum(given) != 1:
            raise ValueError("exactly one of `prompt`, `messages`, `prompt_token_ids` is required")
        if self.v != L.PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {self.v}")
        if self.min_tokens > self.max_tokens:
            raise ValueError("`min_tokens` must not exceed `max_tokens`")


class TokenLogprob(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []


class Token(Struct, tag="token", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Tokens one engine step produced for one request.

    ``seq`` is the index of the first of ``token_ids`` in the request's output (0-based),
    so the events of a request tile ``[0, n)`` without gaps; a client keeps the first copy
    of every index and recovers a gap from the stored progress. ``text`` is the text these
    tokens completed (may be empty while a multi-byte character or a possible stop string
    is pending). ``index`` names the choice of a request with ``n > 1`` (0 otherwise);
    ``seq`` and the tiling rule hold per choice.
    """

    request_id: RequestId
    seq: Annotated[int, Meta(ge=0)]
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    index: Annotated[int, Meta(ge=0, lt=L.MAX_N)] = 0


class Usage(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Timings(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Seconds, measured by workers. ``queued_s``: submit → first start; ``ttft_s``:
    first start → first token; ``total_s``: submit (or first start) → result."""

    queued_s: float | None = None
    ttft_s: float | None = None
    total_s: float = 0.0


class Choice(Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One sample of a request with ``n > 1``: its tokens, text and how it ended."""

    index: Annotated[int, Meta(ge=0, lt=L.MAX_N)]
    finish_reason: Literal["stop", "length", "cancelled", "timeout"]
    stop_reason: str | int | None = None
    text: str
    token_ids: list[int]


class Result(Struct, tag="result", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The terminal event of a request that generated (possibly zero tokens).

    The top-level ``finish_reason``/``text``/``token_ids`` are choice 0's; ``choices``
    holds every choice, in index order, when the request asked for ``n > 1`` (else None);
    ``usage.completion_tokens`` counts the tokens of all choices."""

    request_id: RequestId
    finish_reason: Literal["stop", "length", "cancelled", "timeout"]
    stop_reason: str | int | None = None
    text: str
    token_ids: list[int]
    usage: Usage
    timings: Timings
    worker_id: str = ""
    num_resumes: int = 0
    choices: list[Choice] | None = None


class Failure(Struct, tag="failure", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The terminal event of a request that could not be served. ``code`` is stable
    (see :mod:`shared.errors`); ``message`` is for humans."""

    request_id: RequestId
    code: str
    message: str
    retryable: bool = False


class Cancel(Struct, tag="cancel", kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Broadcast on a model's control channel after setting the request's cancel key.

    The key is the durable signal (a worker checks it when it starts the request and on
    every progress write); this message only makes a running request stop sooner."""

    request_id: RequestId
    tenant: Tenant = "default"


Event = Union[Token, Result, Failure]
Terminal = Union[Result, Failure]
