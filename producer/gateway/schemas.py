"""The OpenAI request bodies the gateway accepts, as msgspec structs (validated at decode).

Unknown fields are ignored, as OpenAI clients send many optional ones; fields whose meaning
the fleet cannot honour (``tool_choice`` "auto", ``echo``...) are refused in
:mod:`producer.gateway.translate` (tools and ``response_format``: :mod:`producer.gateway.tools`)
with a message that says so.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from producer.gateway.errors import from_validation, invalid
from shared import limits as L

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
MaxTokens = Annotated[int, Meta(ge=1, le=L.MAX_TOKENS)]
Seed = Annotated[int, Meta(ge=0, le=L.MAX_SAFE_INTEGER)]
Stop = Union[Annotated[str, Meta(max_length=L.MAX_STOP_STRING_CHARS)],
             Annotated[list[Annotated[str, Meta(max_length=L.MAX_STOP_STRING_CHARS)]],
                       Meta(max_length=L.MAX_STOP_STRINGS)]]
Text = Annotated[str, Meta(max_length=L.MAX_PROMPT_CHARS)]


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class ContentPart(Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str, Meta(max_length=L.MAX_MESSAGE_CHARS)] | list[ContentPart] | None = None
    name: str | None = None


class _Sampling(Struct, kw_only=True):
    """Fields common to both endpoints (OpenAI's, then vLLM-style extras)."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    n: Annotated[int, Meta(ge=1)] = 1
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    user: Annotated[str, Meta(max_length=L.MAX_METADATA_VALUE_CHARS)] | None = None
    # vLLM-style extras (``extra_body`` in the openai client)
    top_k: Annotated[int, Meta(ge=0)] = 0
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] = 1.0
    min_tokens: Annotated[int, Meta(ge=0, le=L.MAX_TOKENS)] = 0
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[Annotated[int, Meta(ge=0)]],
                              Meta(max_length=L.MAX_STOP_TOKEN_IDS)] = []
    request_id: str | None = None


class CompletionRequest(_Sampling, kw_only=True):
    # a string, or a list of one string or of token ids (msgspec allows one array type)
    prompt: Union[Text, Annotated[list[Any], Meta(max_length=L.MAX_PROMPT_TOKENS)]]
    logprobs: Annotated[int, Meta(ge=0, le=L.MAX_LOGPROBS)] | None = None
    echo: bool = False
    best_of: Annotated[int, Meta(ge=1)] | None = None
    suffix: str | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1, max_length=L.MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=L.MAX_LOGPROBS)] | None = None
    metadata: Annotated[dict[Annotated[str, Meta(max_length=L.MAX_METADATA_KEY_CHARS)],
                             Annotated[str, Meta(max_length=L.MAX_METADATA_VALUE_CHARS)]],
                        Meta(max_length=L.MAX_METADATA_ITEMS - 1)] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


_decoders = {cls: msgspec.json.Decoder(cls) for cls in (CompletionRequest, ChatRequest)}


def decode(body: bytes, cls: type[Struct]) -> Any:
    """Decode and validate one request body; raises an OpenAI-shaped 400 on anything wrong."""
    try:
        return _decoders[cls].decode(body)
    except msgspec.MsgspecError as exc:
        raise from_validation(exc) from None
    except RecursionError:  # free-form fields (``tools``, ``tool_choice``) nested too deep
        raise invalid("the body is nested too deeply", code="invalid_value") from None
