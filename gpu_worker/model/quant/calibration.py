"""Calibration for INT4: what each projection's inputs look like on real text, and the
activation-aware input scales (the idea of AWQ, Lin et al. 2023) searched from them.

A few input channels of each projection carry much larger activations than the rest; their
weights matter more to the output than the weights of quiet channels. Before group-wise
INT4 quantization, each input channel j of a weight is multiplied by ``s_j = a_j ** alpha``
(``a_j`` its mean absolute activation on calibration text). The quantized layer divides its
input by ``s`` again, so the product is unchanged but the loud channels get a finer grid.
``alpha`` in [0, 1] is searched per layer for the smallest output error on the calibration
activations (alpha = 0 is plain quantization, so the search never does worse on them).
The same statistics (E[x x^T] per layer) then drive GPTQ (``gptq.py``).

The calibration text needs no download: built-in chat exchanges, plus the model's own greedy
replies to built-in questions (data-free calibration, as in LLM-QAT, Liu et al. 2023): text
in the model's own distribution, about 5,000 tokens for SmolLM2. Neither shares a prompt with
the quality benchmark (``fleet bench quant``). Measured on SmolLM2-135M-Instruct: see the README.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from gpu_worker.model.attention import AttentionMetadata

logger = logging.getLogger(__name__)

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)   # coarse grid; then the best one's neighbours at +-0.125
MAX_ROWS = 1024         # calibration rows kept per layer for the scale search (an even sample)
REPLY_TOKENS = 160      # length of each self-generated reply

CONVERSATIONS = [
    ("How do bees make honey?",
     "Bees collect nectar from flowers and carry it back to the hive in a special stomach. There, "
     "worker bees pass it from one to another, adding enzymes that break its sugars down. They store "
     "it in wax cells and fan it with their wings until most of the water evaporates, then seal the "
     "cells with wax. The thick, sweet result is honey, which feeds the colony through the winter."),
    ("What should I pack for a two-day hiking trip?",
     "Bring a map, a charged phone and a small first-aid kit. Pack layers you can add or remove, a "
     "rain jacket, and sturdy shoes that are already broken in. Carry enough water and a way to "
     "purify more, plus food that is light and gives energy, such as nuts and dried fruit. Add a "
     "headlamp, sunscreen, a hat, and a sleeping bag rated for the night temperatures."),
    ("Explain compound interest with an example.",
     "Compound interest means you earn interest on your interest. If you save 1,000 dollars at 5 "
     "percent a year, after one year you have 1,050. In the second year the 5 percent applies to "
     "1,050, so you earn 52.50 instead of 50. After ten years the balance is about 1,629 dollars, "
     "more than the 1,500 that simple interest would give."),
    ("Write a short thank-you note to a neighbour who watered my plants.",
     "Dear Sam, thank you so much for looking after my plants while I was away. They look healthier "
     "than when I left! It was a real relief to know they were in good hands. Please let me know if "
     "I can ever return the favour. Warm wishes, Alex."),
    ("Why do we have leap years?",
     "The Earth takes about 365.24 days to orbit the Sun, not exactly 365. Without a correction, "
     "the calendar would drift by roughly one day every four years, and the seasons would slowly "
     "move through the months. Adding a day to February every four years, with a few exceptions "
     "for century years, keeps the calendar in step with the seasons."),
    ("How does a bicycle gear system work?",
     "The chain connects a front chainring to a cassette of rear cogs. A small rear cog turns the "
     "wheel many times for each turn of the pedals, which is fast but hard to push. A large rear "
     "cog turns it fewer times, which is easier for climbing hills. The derailleurs move the chain "
     "between cogs when you shift."),
    ("Give me a simple recipe for tomato soup.",
     "Soften a chopped onion and two cloves of garlic in olive oil. Add a can of tomatoes, two cups "
     "of vegetable stock, a pinch of sugar, salt and pepper, and simmer for twenty minutes. Blend "
     "until smooth, stir in a little cream if you like, and serve with bread and fresh basil."),
    ("What is the difference between a lake and a pond?",
     "There is no strict rule, but lakes are usually larger and deeper than ponds. In a pond, "
     "sunlight often reaches the bottom everywhere, so plants can grow across it, and the water "
     "temperature is similar from top to bottom. A lake has deep zones that light does not reach, "
     "and in summer its water forms layers of different temperatures."),
]


# Questions the model answers itself (greedy) for calibration; none is a benchmark prompt.
QUESTIONS = [
    "How do I keep basil alive indoors?", "What makes a good job interview answer?", "Why do cats purr?",
    "Explain how a credit score works.", "What is the best way to learn a new language?", "How do tides work?",
    "Describe how bread rises.", "What should I know before adopting a dog?",
    "How do solar panels make electricity?", "Write a short poem about autumn leaves.",
    "What are some tips for saving money on groceries?", "How does a compass work?",
    "Tell me a fun fact about octopuses.", "Why do onions make you cry?",
    "How do I write a good email subject line?", "What is the difference between weather and climate?",
    "How do noise-cancelling headphones work?", "Plan a simple three-day trip to Rome.", "What is a black hole?",
    "How can I stay focused while studying?", "Explain what a spreadsheet formula is.",
    "Why do leaves change colour in autumn?", "How are rainbows formed?",
    "Give me a quick stretching routine for the morning.",
]


def calibration_sequences(tokenizer, model=None) -> list[list[int]]:
    """Token ids of the built-in exchanges, each as a chat (user turn, assistant reply), or
    as plain text for a model whose tokenizer has no chat template; with ``model`` (still in
    float), also its own greedy replies to :data:`QUESTIONS`."""
    from gpu_worker.errors import InvalidRequestError

    def prompt_ids(question: str) -> list[int]:
        try:
            return tokenizer.apply_chat_template([{"role": "user", "content": question}])
        except InvalidRequestError:
            return tokenizer.encode(question + "\n")

    seqs = [prompt_ids(q) + tokenizer.encode(a) for q, a in CONVERSATIONS]
    if model is not None:
        prompts = [prompt_ids(q) for q in QUESTIONS]
        room = model.cos_table.shape[0] - max(map(len, prompts))    # the model's positions
        if room > 0:
            seqs += [p + r for p, r in zip(prompts, greedy_replies(model, prompts, min(REPLY_TOKENS, room)))]
    limit = model.cos_table.shape[0] if model is not None else None
    return [s[:limit] for s in seqs]


def _fresh_caches(model, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.cfg
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    return [(torch.zeros(shape, dtype=model.embed.dtype, device=model.embed.device),
             torch.zeros(shape, dtype=model.embed.dtype, device=model.embed.device))
            for _ in range(cfg.num_layers)]


@torch.inference_mode()
def prefill_hidden(model, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Final hidden states [len(token_ids), hidden] of one sequence, prefilled in one pass
    over fresh KV caches (no engine needed)."""
    dev, n = model.embed.device, len(token_ids)
    num_blocks = -(-n // block_size)
    meta = AttentionMetadata(torch.arange(n, device=dev), torch.arange(num_blocks, device=dev)[None, :],
                             [n], [n], 0, block_size)
    positions = torch.arange(n, device=dev)
    return model(torch.tensor(token_ids, device=dev), positions, _fresh_caches(model, num_blocks, block_size),
                 model.ops.plan_attention(meta))


@torch.inference_mode()
def greedy_replies(model, prompts: list[list[int]], max_new_tokens: int, block_size: int = 16) -> list[list[int]]:
    """Greedy continuations (exactly ``max_new_tokens`` each), all prompts in one batch over
    private KV caches: one prefill pass, then one decode pass per token (no engine needed)."""
    dev, n = model.embed.device, len(prompts)
    order = sorted(range(n), key=lambda i: len(prompts[i]))     # decode rows by context length
    seqs = [list(prompts[i]) for i in order]
    per_seq = -(-(len(seqs[-1]) + max_new_tokens) // block_size)
    caches = _fresh_caches(model, n * per_seq, block_size)
    tables = torch.arange(n * per_seq, device=dev).view(n, per_seq)
    new_tokens = [len(s) for s in seqs]                          # the first pass feeds whole prompts
    for _ in range(max_new_tokens):
        positions = [p for s, k in zip(seqs, new_tokens) for p in range(len(s) - k, len(s))]
        rows = [i for i, s in enumerate(seqs) for _ in range(len(s) - new_tokens[i], len(s))]
        slots = [i * per_seq * block_size + p for i, p in zip(rows, positions)]
        ids = [t for s, k in zip(seqs, new_tokens) for t in s[len(s) - k:]]
        lens = [len(s) for s in seqs]
        meta = AttentionMetadata(torch.tensor(slots, device=dev), tables, lens, new_tokens,
                                 n if all(k == 1 for k in new_tokens) else 0, block_size)
        hidden = model(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), caches,
                       model.ops.plan_attention(meta))
        last = torch.tensor(list(itertools.accumulate(new_tokens)), device=dev) - 1
        for s, t in zip(seqs, model.compute_logits(hidden.index_select(0, last)).argmax(-1).tolist()):
            s.append(t)
        new_tokens = [1] * n
    replies = {i: s[len(prompts[i]):] for s, i in zip(seqs, order)}
    return [replies[i] for i in range(n)]


@dataclass
class LayerInputs:
    """What one projection's inputs looked like on the calibration text."""

    second_moment: torch.Tensor     # [K, K] E[x x^T] (GPTQ's H, up to a factor 2)
    abs_mean: torch.Tensor          # [K] E|x|
    sample: torch.Tensor            # [<= MAX_ROWS, K] an even sample of the rows

    @classmethod
    def from_rows(cls, x: torch.Tensor, max_rows: int = MAX_ROWS) -> LayerInputs:
        x = x.float()
        return cls(x.t() @ x / x.shape[0], x.abs().mean(0), _even_sample(x, max_rows))


def _even_sample(x: torch.Tensor, max_rows: int) -> torch.Tensor:
    if x.shape[0] <= max_rows:
        return x
    return x[torch.linspace(0, x.shape[0] - 1, max_rows).long().to(x.device)]


@torch.inference_mode()
def layer_inputs(model: nn.Module, sequences: list[list[int]], is_target: Callable[[nn.Module], bool],
                 max_rows: int = MAX_ROWS) -> dict[nn.Module, LayerInputs]:
    """Statistics of the inputs each target module receives while the model prefills
    ``sequences``: E[x x^T] and E|x| over every row, and an even sample of the rows."""
    total = sum(len(s) for s in sequences)
    stride = max(1, total // max_rows)
    acc: dict[nn.Module, list] = {}     # module -> [sum x x^T, sum |x|, rows, sampled rows]

    def hook(mod, args, _out):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        a = acc.setdefault(mod, [0.0, 0.0, 0, []])
        a[0] = a[0] + x.t() @ x
        a[1] = a[1] + x.abs().sum(0)
        a[3].append(x[(-a[2]) % stride::stride])
        a[2] += x.shape[0]

    handles = [m.register_forward_hook(hook) for m in model.modules() if is_target(m)]
    try:
        for seq in sequences:
            prefill_hidden(model, seq)
    finally:
        for h in handles:
            h.remove()
    return {mod: LayerInputs(xx / n, s / n, _even_sample(torch.cat(rows), max_rows))
            for mod, (xx, s, n, rows) in acc.items()}


@torch.no_grad()
def search_input_scales(weight: torch.Tensor, inputs: LayerInputs,
                        quantize_dequantize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                        ) -> tuple[torch.Tensor, float]:
    """Per-input-channel scales s (and the alpha chosen) minimizing ||x W^T - x (Q(W s) / s)^T||
    on the sampled rows, with s = a ** alpha, a = E|x| per channel. ``quantize_dequantize``
    gets the scaled weight and the per-channel importance E[(x / s)^2] of its inputs."""
    w = weight.float()
    x = inputs.sample.to(w.device)
    act = inputs.abs_mean.to(w.device).clamp_min(1e-6)
    power = torch.diag(inputs.second_moment).to(w.device)
    reference = x @ w.t()

    def error(alpha: float) -> tuple[float, torch.Tensor]:
        s = act.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()          # centre the scales around 1
        importance = power / s.pow(2)
        w_hat = quantize_dequantize(w * s, importance + 1e-3 * importance.mean()) / s
        return (x @ w_hat.t() - reference).pow(2).sum().item(), s

    tried = {a: error(a) for a in ALPHAS}
    coarse = min(tried, key=lambda a: tried[a][0])
    for a in (coarse - 0.125, coarse + 0.125):
        if 0.0 < a < 1.0:
            tried[a] = error(a)
    alpha = min(tried, key=lambda a: tried[a][0])
    return tried[alpha][1], alpha
