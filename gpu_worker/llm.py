"""The offline API: generate without Redis.

    from gpu_worker import LLM, SamplingParams
    llm = LLM()                                   # embedded SmolLM2-135M-Instruct
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].text)
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Union

from gpu_worker.config import EngineConfig
from gpu_worker.engine import EngineCore
from gpu_worker.errors import InvalidRequestError
from gpu_worker.fork import ParallelSampling
from gpu_worker.outputs import CompletionOutput, RequestDelta
from gpu_worker.sampling_params import SamplingParams

# A prompt is text, a chat (list of {"role", "content"} dicts), or token ids.
Prompt = Union[str, Sequence[dict], Sequence[int]]


class LLM:
    """Owns one :class:`EngineCore`; ``engine_options`` are :class:`EngineConfig` fields."""

    def __init__(self, model: str | None = None, **engine_options) -> None:
        self.engine = EngineCore(EngineConfig(model=model, **engine_options))
        self.tokenizer = self.engine.tokenizer
        self.sampling = ParallelSampling(self.engine)
        self._ids = itertools.count()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (chat messages go through the chat template)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            return self.tokenizer.apply_chat_template(items)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
            return items
        raise InvalidRequestError("invalid_prompt", "a prompt is a string, a list of chat messages, or token ids")

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 n: int = 1) -> list[CompletionOutput]:
        """Run every prompt in one continuous batch; results in prompt order. A bad prompt
        raises before anything runs. ``n > 1``: each prompt's ``n`` samples share its KV
        blocks; an output is its sample 0 with all ``n`` in ``choices``."""
        outputs = {rid: [CompletionOutput(request_id=rid, prompt_token_ids=ids, index=i) for i in range(n)]
                   for rid, ids, _ in self._submit(_as_list(prompts), params, n)}   # in prompt order
        while self.sampling.has_unfinished_requests():
            for delta in self.sampling.step():
                _accumulate(outputs[delta.request_id][delta.index], delta)
        return [_merged(choices) for choices in outputs.values()]

    def stream(self, prompts: Prompt | Sequence[Prompt],
               params: SamplingParams | Sequence[SamplingParams] | None = None, *,
               n: int = 1) -> Iterator[tuple[int, RequestDelta]]:
        """Yield ``(prompt index, delta)`` as tokens come, across all prompts at once
        (``delta.index``: the sample, with ``n > 1``)."""
        index = {rid: i for i, (rid, _, _) in enumerate(self._submit(_as_list(prompts), params, n))}
        while self.sampling.has_unfinished_requests():
            for delta in self.sampling.step():
                yield index[delta.request_id], delta

    def _submit(self, prompts: list, params, n: int = 1) -> list[tuple[str, list[int], SamplingParams]]:
        params = SamplingParams() if params is None else params
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        batch = [(f"offline-{next(self._ids)}", self.encode(p), sp) for p, sp in zip(prompts, plist)]
        added = []
        try:
            for rid, ids, sp in batch:
                self.sampling.add_request(rid, ids, sp, n=n)
                added.append(rid)
        except InvalidRequestError:
            for rid in added:
                self.sampling.abort_request(rid)
            while self.sampling.has_unfinished_requests():
                self.sampling.step()
            raise
        return batch


def _as_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and isinstance(items[0], (dict, int)):
        return [items]      # a single chat or a single token-id list
    return items


def _merged(choices: list[CompletionOutput]) -> CompletionOutput:
    """Sample 0, with every sample in ``choices`` when there are several."""
    if len(choices) == 1:
        return choices[0]
    return dataclasses.replace(choices[0], token_ids=list(choices[0].token_ids), choices=choices)


def _accumulate(out: CompletionOutput, delta: RequestDelta) -> None:
    out.token_ids.extend(delta.new_token_ids)
    out.text += delta.new_text
    if delta.logprobs is not None:
        out.logprobs = (out.logprobs or []) + list(delta.logprobs)
    out.num_cached_tokens = delta.num_cached_tokens
    if delta.finished:
        out.finish_reason = delta.finish_reason
        out.error_code, out.error_message = delta.error_code, delta.error_message
