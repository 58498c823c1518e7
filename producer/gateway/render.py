"""Fleet events -> OpenAI response objects (chat and text completions, whole or chunked)."""
from __future__ import annotations

import time
from typing import Any

from producer.gateway.tools import as_tool_call, new_call_id
from shared.protocol import Result, Token, TokenLogprob
from shared.results import all_choices

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
                 logprobs: bool, include_usage: bool = False, tool: str | None = None) -> None:
        self.chat = chat
        # A forced tool call (producer/gateway/tools.py): the text is the call's arguments.
        self.tool, self._call_id, self._tool_open = tool, new_call_id(), set()
        self.include_usage = include_usage
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.names = names
        self.logprobs = logprobs
        self._offsets: dict[int, int] = {}  # completions logprobs: per choice, the next offset
        self._opened: set[int] = {0}  # chat stream choices whose role was sent

    def _envelope(self, choices: list[dict], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}
        if chunk and self.include_usage:
            body["usage"] = None  # OpenAI: every chunk but the last carries a null usage
        return body

    def _choice(self, text: str | None, logprobs: Any, finish: str | None, *,
                chunk: bool, role: bool = False, index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat and chunk:
            choice["delta"] = ({"role": "assistant"} if role else {}) | \
                ({} if text is None else {"content": text})
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text or ""
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish
        if self.tool is not None and self.chat:
            as_tool_call(choice, self.tool, self._call_id, self._tool_open, chunk=chunk)
        return choice

    def first_chunk(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role and empty content (choice 0; another
        choice's first chunk carries its role)."""
        self._opened = {0}
        return self._envelope([self._choice("", None, None, chunk=True, role=True)], True) \
            if self.chat else None

    def token_chunk(self, event: Token) -> dict[str, Any] | None:
        logprobs = self._logprobs(event.logprobs or [], event.index)
        role = event.index not in self._opened
        if not event.text and logprobs is None and not role:
            return None
        self._opened.add(event.index)
        return self._envelope([self._choice(event.text, logprobs, None, chunk=True, role=role,
                                            index=event.index)], True)

    def final_chunk(self, result: Result) -> dict[str, Any]:
        """Every choice's finish reason, in one chunk."""
        return self._envelope([self._choice(None if self.chat else "", None,
                                            FINISH_REASONS[c.finish_reason], chunk=True,
                                            index=c.index) for c in all_choices(result)], True)

    def usage_chunk(self, result: Result) -> dict[str, Any]:
        body = self._envelope([], True)
        body["usage"] = usage(result)
        return body

    def response(self, result: Result, tokens: list[Token]) -> dict[str, Any]:
        """The whole (non-streaming) response: a choice per sample, ``usage`` of them all."""
        self._offsets = {}
        choices = []
        for c in all_choices(result):
            entries = [e for t in tokens if t.index == c.index for e in (t.logprobs or [])]
            choices.append(self._choice(c.text, self._logprobs(entries, c.index),
                                        FINISH_REASONS[c.finish_reason], chunk=False,
                                        index=c.index))
        body = self._envelope(choices, False)
        body["usage"] = usage(result)
        return body

    def _logprobs(self, entries: list[TokenLogprob], index: int = 0) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(e) for e in entries], "refusal": None}
        tokens = [self.names(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offset = self._offsets.get(index, 0)
            offsets.append(offset)
            self._offsets[index] = offset + len(token)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.names(t): lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}

    def _chat_entry(self, entry: TokenLogprob) -> dict[str, Any]:
        def item(token_id: int, logprob: float) -> dict[str, Any]:
            name = self.names(token_id)
            return {"token": name, "logprob": logprob, "bytes": list(name.encode())}

        return item(entry.token_id, entry.logprob) | \
            {"top_logprobs": [item(t, lp) for t, lp in entry.top]}
