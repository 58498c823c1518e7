"""A thin, typed wrapper over a Hugging Face tokenizer."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_worker.errors import InvalidRequestError


class Tokenizer:
    """Encodes prompts and chat messages; decodes ids. Loaded from a local directory only."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(model_dir))   # the transformers tokenizer itself

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, add_special_tokens=True)["input_ids"])

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of a chat, ending with the assistant's generation prompt."""
        if not messages:
            raise InvalidRequestError("empty_prompt", "chat has no messages")
        try:
            out = self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # a template error is the caller's bad input
            raise InvalidRequestError("invalid_messages", f"chat template failed: {exc}") from exc
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def all_special_ids(self) -> set[int]:
        return set(self.hf.all_special_ids)
