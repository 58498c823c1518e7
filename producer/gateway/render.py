"""Fleet events -> OpenAI response objects (chat and text completions, whole or chunked)."""
from __future__ import annotations

import time
from typing import Any

from shared.protocol import Result, Token, TokenLogprob

# The fleet's finish reasons in OpenAI's vocabulary: a deadline is a limit that cut the
# answer ("length"); a cancelled request simply stopped ("stop").
FINISH_REASONS = {"stop": "stop", "length": "length", "timeout": "length", "cancelled": "stop"}


class TokenNames:
    """Names of token ids for logprobs: decoded by a tokenizer when one is configured,
    else ``token_id:N`` (the convention vLLM uses for ``return_tokens_as_token_ids``)."""

    def __init__(self, tokenizer_dir: str | None = None) -> None:
        self._tok = None
        if tokenizer_dir:
            from pathlib import Path

            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))

    def __call__(self, token_id: int) -> str:
        if self._tok is None:
            return f"token_id:{token_id}"
        return self._tok.decode([token_id], skip_special_tokens=False)


def usage(result: Result) -> dict[str, Any]:
    u = result.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


class Renderer:
    """Builds the objects of one response; ``chat`` picks the chat or completions shape."""

    def __init__(self, *, chat: bool, response_id: str, model: str, names: TokenNames,
                 logprobs: bool, include_usage: bool = False) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.names = names
        self.logprobs = logprobs
        self._offset = 0  # completions logprobs: text offset of the next token

    def _envelope(self, choices: list[dict], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}
        if chunk and self.include_usage:
            body["usage"] = None  # OpenAI: every chunk but the last carries a null usage
        return body

    def _choice(self, text: str | None, logprobs: Any, finish: str | None, *,
                chunk: bool, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat and chunk:
            choice["delta"] = ({"role": "assistant"} if role else {}) | \
                ({} if text is None else {"content": text})
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text or ""
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        return choice

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role and empty content."""
        return self._envelope([self._choice("", None, None, chunk=True, role=True)], True) \
            if self.chat else None

    def token_chunk(self, event: Token) -> dict[str, Any] | None:
        logprobs = self._logprobs(event.logprobs or [])
        if not event.text and logprobs is None:
            return None
        return self._envelope([self._choice(event.text, logprobs, None, chunk=True)], True)

    def final_chunk(self, result: Result) -> dict[str, Any]:
        finish = FINISH_REASONS[result.finish_reason]
        return self._envelope([self._choice(None if self.chat else "", None, finish, chunk=True)],
                              True)

    def usage_chunk(self, result: Result) -> dict[str, Any]:
        body = self._envelope([], True)
        body["usage"] = usage(result)
        return body

    def response(self, result: Result, tokens: list[Token]) -> dict[str, Any]:
        """The whole (non-streaming) response."""
        self._offset = 0
        entries = [e for t in tokens for e in (t.logprobs or [])]
        logprobs = self._logprobs(entries)
        choice = self._choice(result.text, logprobs, FINISH_REASONS[result.finish_reason],
                              chunk=False)
        body = self._envelope([choice], False)
        body["usage"] = usage(result)
        return body

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries], "refusal": None}
        tokens = [self.names(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.names(t): lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}

    def _chat_entry(self, entry: TokenLogprob) -> dict[str, Any]:
        def item(token_id: int, logprob: float) -> dict[str, Any]:
            name = self.names(token_id)
            return {"token": name, "logprob": logprob, "bytes": list(name.encode())}

        return item(entry.token_id, entry.logprob) | \
            {"top_logprobs": [item(t, lp) for t, lp in entry.top]}
