"""OpenAI request -> fleet request fields (:class:`shared.protocol.Request` keywords)."""
from __future__ import annotations

import time
import uuid
from typing import Any

from producer.gateway.errors import invalid
from producer.gateway.options import GatewayOptions
from producer.gateway.schemas import ChatRequest, CompletionRequest, Message, _Sampling
from producer.gateway.tools import structured_field
from shared import limits as L

_ROLES = {"developer": "system"}  # OpenAI's newer name for the system role


def new_id(prefix: str) -> str:
    """A response id that is also the fleet request id (so ``fleet status`` can find it)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def _refuse_unsupported(req: _Sampling) -> None:
    if req.n > L.MAX_N:
        raise invalid(f"n={req.n} is more than the fleet's {L.MAX_N} choices per request",
                      param="n", code="unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options is only allowed with stream=true", param="stream_options")


def _common(req: _Sampling, options: GatewayOptions, max_tokens: int | None,
            default_max_tokens: int) -> dict[str, Any]:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fields: dict[str, Any] = {
        "max_tokens": max_tokens or default_max_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "min_p": req.min_p, "seed": req.seed, "stop": [s for s in stop if s],
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "min_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos, "stop_token_ids": list(req.stop_token_ids),
        "priority": options.lane, "deadline": time.time() + options.request_timeout_s,
        "metadata": {"user": req.user} if req.user else {}, "n": req.n,
    }
    if fields["min_tokens"] > fields["max_tokens"]:
        raise invalid("min_tokens must not exceed max_tokens", param="min_tokens")
    return fields


def completion_fields(req: CompletionRequest, options: GatewayOptions) -> dict[str, Any]:
    """Fleet fields of a ``/v1/completions`` request (one prompt: text or token ids)."""
    _refuse_unsupported(req)
    if req.echo:
        raise invalid("echo is not supported", param="echo", code="unsupported_value")
    if req.suffix:
        raise invalid("suffix is not supported", param="suffix", code="unsupported_value")
    if req.best_of not in (None, 1, req.n):  # best_of == n: every sample is returned
        raise invalid("best_of other than n is not supported", param="best_of",
                      code="unsupported_value")
    fields = _common(req, options, req.max_tokens, 16)  # OpenAI's completions default
    fields.update(_prompt(req.prompt))
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
    return fields


def _prompt(prompt: str | list) -> dict[str, Any]:
    # OpenAI's forms: a string, [string], token ids, [token ids]; unwrap one level only, so
    # a hostile nesting cannot recurse.
    if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return {"prompt_token_ids": prompt}
    if not prompt:
        raise invalid("prompt must not be empty", param="prompt")
    raise invalid("prompt must be a string, one string in a list, or a list of token ids "
                  "(several prompts in one request are not supported)", param="prompt")


def chat_fields(req: ChatRequest, options: GatewayOptions) -> dict[str, Any]:
    """Fleet fields of a ``/v1/chat/completions`` request."""
    _refuse_unsupported(req)
    structured = structured_field(req)   # response_format, or a forced tool call (tools.py)
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs requires logprobs=true", param="top_logprobs")
    max_tokens = req.max_completion_tokens or req.max_tokens
    fields = _common(req, options, max_tokens, options.default_max_tokens)
    fields["messages"] = [_message(m, i) for i, m in enumerate(req.messages)]
    if structured is not None:
        fields["structured"] = structured
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
    if req.metadata:
        fields["metadata"] = {**req.metadata, **fields["metadata"]}
    return fields


def _message(message: Message, index: int) -> dict[str, str]:
    content = message.content
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise invalid(f"content part of type {part.type!r} is not supported (text only)",
                              param=f"messages[{index}].content")
            parts.append(part.text)
        content = "".join(parts)
    return {"role": _ROLES.get(message.role, message.role), "content": content or ""}
