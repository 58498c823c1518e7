"""Activation-aware INT4 scales (the idea of AWQ, Lin et al. 2023), from built-in text.

A few input channels of each projection carry much larger activations than the rest; their
weights matter more to the output than the weights of quiet channels. Before group-wise
INT4 quantization, each input channel j of a weight is multiplied by ``s_j = a_j ** alpha``
(``a_j`` its mean absolute activation on calibration text). The quantized layer divides its
input by ``s`` again, so the product is unchanged but the loud channels get a finer grid.
``alpha`` in [0, 1] is searched per layer for the smallest output error on the calibration
activations (alpha = 0 is plain quantization, so the search never does worse on them).

The calibration text is built in (short chat exchanges on everyday topics). It shares no
text with the quality benchmark (``fleet bench quant``), which measures on other prompts.
Measured on SmolLM2-135M-Instruct at group 128: see the README.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from gpu_worker.model.attention import AttentionMetadata

logger = logging.getLogger(__name__)

ALPHAS = tuple(i / 10 for i in range(11))
MAX_ROWS = 1024         # calibration rows kept per layer (the search's sample)

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


def calibration_sequences(tokenizer) -> list[list[int]]:
    """Token ids of the built-in exchanges, each as a chat (user turn, assistant reply), or
    as plain text for a model whose tokenizer has no chat template."""
    from gpu_worker.errors import InvalidRequestError

    seqs = []
    for question, answer in CONVERSATIONS:
        try:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        except InvalidRequestError:
            prompt = tokenizer.encode(question + "\n")
        seqs.append(prompt + tokenizer.encode(answer))
    return seqs


@torch.inference_mode()
def prefill_hidden(model, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Final hidden states [len(token_ids), hidden] of one sequence, prefilled in one pass
    over fresh KV caches (no engine needed)."""
    cfg, dev, n = model.cfg, model.embed.device, len(token_ids)
    num_blocks = -(-n // block_size)
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=model.embed.dtype, device=dev),
               torch.zeros(shape, dtype=model.embed.dtype, device=dev)) for _ in range(cfg.num_layers)]
    meta = AttentionMetadata(torch.arange(n, device=dev), torch.arange(num_blocks, device=dev)[None, :],
                             [n], [n], 0, block_size)
    positions = torch.arange(n, device=dev)
    return model(torch.tensor(token_ids, device=dev), positions, caches, model.ops.plan_attention(meta))


@torch.inference_mode()
def linear_inputs(model: nn.Module, sequences: list[list[int]], is_target: Callable[[nn.Module], bool],
                  max_rows: int = MAX_ROWS) -> dict[nn.Module, torch.Tensor]:
    """The rows each target module receives while the model prefills ``sequences``
    (float32, at most ``max_rows`` per module, an even sample)."""
    seen: dict[nn.Module, list[torch.Tensor]] = {}

    def hook(mod, args, _out):
        seen.setdefault(mod, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float())

    handles = [m.register_forward_hook(hook) for m in model.modules() if is_target(m)]
    try:
        for seq in sequences:
            prefill_hidden(model, seq)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for mod, rows in seen.items():
        x = torch.cat(rows)
        if x.shape[0] > max_rows:
            x = x[torch.linspace(0, x.shape[0] - 1, max_rows).long()]
        out[mod] = x
    return out


@torch.no_grad()
def search_input_scales(weight: torch.Tensor, x: torch.Tensor,
                        quantize_dequantize: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """Per-input-channel scales s (and the alpha chosen) minimizing
    ||x W^T - x (Q(W s) / s)^T||, with s = a ** alpha, a the mean |x| per channel."""
    w = weight.float()
    x = x.to(w.device)
    act = x.abs().mean(0).clamp_min(1e-6)
    reference = x @ w.t()
    best = (float("inf"), torch.ones_like(act), 0.0)
    for alpha in ALPHAS:
        s = act.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()          # centre the scales around 1
        err = (x @ (quantize_dequantize(w * s) / s).t() - reference).pow(2).sum().item()
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]
