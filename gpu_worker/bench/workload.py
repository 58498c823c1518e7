"""The seeded mixed-length workload shared by the throughput, e2e and spec benchmarks."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

PROMPT_RANGE = (8, 384)
OUTPUT_RANGE = (4, 160)
# Ordinary vocabulary ids of SmolLM2's tokenizer (past its special tokens).
TOKEN_RANGE = (100, 48000)
# ``--structured``: a JSON Schema on every request that no output of OUTPUT_RANGE completes
# (so constrained requests generate exactly max_tokens, as the unconstrained ones do).
STRUCTURED_SCHEMA = {"type": "array", "minItems": 1000,
                     "items": {"type": "object", "required": ["word", "n"], "additionalProperties": False,
                               "properties": {"word": {"type": "string", "maxLength": 12},
                                              "n": {"type": "integer"}}}}


@dataclass(frozen=True)
class WorkItem:
    prompt_token_ids: list[int]
    max_tokens: int     # fixed output length: generated with ignore_eos


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def mixed_workload(num_requests: int, seed: int = 0) -> list[WorkItem]:
    """Prompt lengths 8–384 and output lengths 4–160 tokens, log-uniform, seeded."""
    rng = random.Random(seed)
    items = []
    for _ in range(num_requests):
        n_prompt = log_uniform(rng, *PROMPT_RANGE)
        n_out = log_uniform(rng, *OUTPUT_RANGE)
        prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(n_prompt)]
        items.append(WorkItem(prompt, n_out))
    return items
