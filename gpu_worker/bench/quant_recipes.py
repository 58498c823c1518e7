"""Quantization recipes compared by fake quantization: each projection's weight (and, if
asked, the tied LM head's) is replaced by its quantized-then-dequantized value in the fp32
model, so the numerics are those of the quantized kernels up to fp32 summation order, and
the comparison does not depend on which kernels run them. Measured per recipe as
``fleet bench quant`` does (``quant_quality.py``): perplexity on TEXT, teacher-forced
agreement and the free-running prefix fraction on the held-out PROMPTS, and the bytes the
recipe's format would take.

A recipe is ``<layers>[@<projection>=<part>...][+head-<head>]``: ``@down=int8`` gives the named
projections (``qkv``, ``o_proj``, ``gate_up``, ``down``) their own part, a per-tensor mix like
llama.cpp's Q4_K_M, which keeps some tensors at more bits. Each part is ``int8`` or ``int4``, then optionally
``-g<group>``, then optionally one of ``-clip`` (INT8: least-squares clipped scales,
``int8_fit.py``), ``-gptq`` (INT8: GPTQ, ``gptq.gptq_int8``) or ``-rtn`` (INT4: the
uncalibrated least-squares fit). A plain INT4 part is the calibrated default (activation-
aware scales + GPTQ, ``gptq.calibrated_int4``); a plain INT8 part is absmax rounding
(``kernels.quantize.quantize_int8``, per channel without a group). INT4 groups fall back
to a power of two dividing K, as ``--quantization`` does. A projection part may also be
``w8a8`` (``--quantization w8a8``'s smoothed weights, ``smooth.py``, with the input rounded
to int8 per row as the kernels do) or ``w8a8-a<group>``: the input rounded with one scale per
group of that many input features instead (``--quantization w8a8-a<group>``).

    python -m gpu_worker.bench.quant_recipes --recipes int8,int8-g32,int8-g32+head-int8-g32
"""
from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.bench import quant_quality as qq
from gpu_worker.model.ops.base import Linear
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from gpu_worker.model.ops.onednn import PackedLinear
from gpu_worker.model.quant import gptq
from gpu_worker.model.quant.calibration import LayerInputs, calibration_sequences, layer_inputs, prefill_hidden
from gpu_worker.model.quant.int4_fit import fit_int4
from gpu_worker.model.quant.int8_fit import fit_int8
from gpu_worker.model.quant.quantize import INT4_GROUP, _projections, int4_group_for, parse_method
from gpu_worker.model.quant.smooth import smoothed_int8
from kernels.cpu.linear import quantize_rows
from kernels.quantize import dequantize_int4, dequantize_int8, half_grid, quantize_int8

logger = logging.getLogger(__name__)

_PART = re.compile(r"^(int8|int4)(?:-g(\d+))?(?:-(clip|gptq|rtn))?$")


def parse_part(part: str) -> tuple[str, int | None, str]:
    """'int8-g32-gptq' -> ('int8', 32, 'gptq'); ValueError for what no recipe implements."""
    m = _PART.match(part)
    if not m:
        raise ValueError(f"unknown recipe part {part!r}")
    method, group, variant = m.group(1), int(m.group(2)) if m.group(2) else None, m.group(3) or ""
    if (method, variant) in (("int8", "rtn"), ("int4", "clip"), ("int4", "gptq")):
        raise ValueError(f"{part!r}: -{variant} does not apply to {method}")
    return method, (group or INT4_GROUP) if method == "int4" else group, variant


def fake_quantize(w: torch.Tensor, part: str, inputs: LayerInputs | None) -> tuple[torch.Tensor, int]:
    """w [N, K] -> (its dequantized value under ``part`` [N, K] float32, the format's bytes)."""
    method, group, variant = parse_part(part)
    n, k = w.shape
    if method == "int8":
        importance = None if inputs is None else torch.diag(inputs.second_moment)
        if variant == "gptq":
            q, s = gptq.gptq_int8(w, inputs.second_moment, group)
        elif variant == "clip":
            q, s = fit_int8(w, group, importance)
        else:
            q, s = quantize_int8(w, group)
        return dequantize_int8(q, s), n * k + 4 * s.numel()
    g = int4_group_for(k, group)
    if variant == "rtn":
        packed, scales, mins = fit_int4(w, g)
        s = None
    else:
        packed, scales, mins, s = gptq.calibrated_int4(w, inputs, g)
    scales, mins = half_grid(scales, mins)   # as quantize.py's modules: the fit, then fp16 (2 bytes each)
    w_hat, nbytes = dequantize_int4(packed, scales, mins, g), n * k // 2 + 4 * scales.numel()
    return (w_hat, nbytes) if s is None else (w_hat / s, nbytes + 4 * k)


def w8a8_group(part: str) -> int | None:
    """'w8a8' -> None (one activation scale a row), 'w8a8-a32' -> 32; ValueError for a group
    that is not a power of two >= 16, or a part that is not W8A8 (``--quantization``'s rules)."""
    if "+" in part or not part.startswith("w8a8"):
        raise ValueError(f"not a w8a8 part: {part!r}")
    return parse_method(part).activation_group


class FakeW8A8(nn.Module):
    """y = round8(x / s) @ (q * scale)^T (+ b), the input rounded to int8 per row (``group``
    None) or per group of input features, as ``linear_w8a8`` does; the smoothing searched for
    that rounding (``smooth.py``)."""

    def __init__(self, lin: nn.Module, inputs: LayerInputs, group: int | None) -> None:
        super().__init__()
        if group is not None and lin.in_features % group:
            raise ValueError(f"w8a8-a{group}: in_features {lin.in_features} is not a multiple of it")
        q, scale, self.s, _ = smoothed_int8(lin.weight.detach(), inputs, group)
        self.weight, self.bias, self.group = dequantize_int8(q, scale), lin.bias, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return F.linear(quantize_rows(x / self.s, self.group), self.weight, self.bias)


def _dense(weight: torch.Tensor, bias: torch.Tensor | None, like: nn.Module | None) -> nn.Module:
    """An fp32 projection holding ``weight``, of the kind ``like`` is (packed f32 tiles,
    oneDNN-packed or plain)."""
    if isinstance(like, CpuPackedLinear):
        return CpuPackedLinear.dense(weight, like.fmt, bias)
    if isinstance(like, PackedLinear):
        return PackedLinear(weight, bias)
    lin = Linear(weight.shape[0], weight.shape[1], bias is not None)
    lin.weight.data.copy_(weight)
    if bias is not None:
        lin.bias.data.copy_(bias)
    return lin


class FakeQuantized:
    """One fp32 model whose projections (and LM head) are swapped for fake-quantized ones
    recipe after recipe, with the calibration statistics collected once on the fp32 model."""

    def __init__(self, model: nn.Module, calibration: list[list[int]]) -> None:
        self.model = model
        self.layers = _projections(model)
        self.head = model.packed_head
        self.head_weight = (model.packed_head.weight if model.packed_head is not None else model.lm_head).detach()
        targets = {child for _, _, child in self.layers}
        self.stats = layer_inputs(model, calibration, lambda m: m in targets)
        self.head_stats = LayerInputs.from_rows(torch.cat([prefill_hidden(model, s) for s in calibration]))
        self._cached: tuple[str, list[nn.Module], int] | None = None

    def apply(self, recipe: str) -> dict[str, int]:
        """Swap in ``recipe``'s weights (fp32 where a part is absent); returns the bytes of the
        projections and of the LM head in the recipe's formats."""
        layers, _, head = recipe.partition("+head-")
        swapped, nbytes = self._layers(layers)
        for (parent, name, _), module in zip(self.layers, swapped):
            setattr(parent, name, module)
        head_bytes = self.head_weight.numel() * 4
        self.model.packed_head = self.head
        if head:
            w_hat, head_bytes = fake_quantize(self.head_weight, head, self.head_stats)
            self.model.packed_head = _dense(w_hat, None, self.head)
        return {"linear_weight_bytes": nbytes, "lm_head_bytes": head_bytes}

    def _layers(self, part: str) -> tuple[list[nn.Module], int]:
        if self._cached is None or self._cached[0] != part:
            self._cached = None         # free the previous recipe's copies first
            default, *overrides = part.split("@")
            own = dict(o.split("=", 1) for o in overrides)
            unknown = set(own) - {name for _, name, _ in self.layers}
            if unknown:
                raise ValueError(f"{part!r}: no projection named {', '.join(sorted(unknown))}")
            modules, total = [], 0
            for _, name, child in self.layers:
                own_part = own.get(name, default)
                if own_part.startswith("w8a8"):
                    modules.append(FakeW8A8(child, self.stats[child], w8a8_group(own_part)))
                    total += child.weight.numel() + 4 * (child.out_features + child.in_features)
                    continue
                w_hat, nbytes = fake_quantize(child.weight.detach(), own_part, self.stats[child])
                modules.append(_dense(w_hat, child.bias, child))
                total += nbytes
            self._cached = (part, modules, total)
        return self._cached[1], self._cached[2]

    def restore(self) -> None:
        """Put the fp32 projections and LM head back."""
        for parent, name, child in self.layers:
            setattr(parent, name, child)
        self.model.packed_head = self.head


DEFAULT_RECIPES = ("int8,int8-g128,int8-g64,int8-g32,int8-g32-clip,int8-gptq,int8-g32-gptq,"
                   "int8+head-int8,int8-g32+head-int8,int8-g32+head-int8-g32,"
                   "int4,int4-g64,int4-g32,int4+head-int8,int4-g32+head-int8,int4-g32+head-int8-g32")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipes (see the module doc)")
    p.add_argument("--prompts", type=int, default=len(qq.PROMPTS))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", type=Path, default=Path("quant_recipes.json"))


def evaluate(llm, prompts: list[list[int]], ref_gen: list[list[int]], text_ids: list[int]) -> dict:
    """Perplexity, teacher-forced agreement and free-running agreement of ``llm`` (as its
    model now stands) against fp32's greedy outputs ``ref_gen``."""
    model = llm.engine.model
    tf = [qq.teacher_forced_argmax(model, p, c) for p, c in zip(prompts, ref_gen)]
    return {"perplexity": qq.perplexity(model, text_ids), "teacher_forced": qq.agreement(ref_gen, tf),
            "free_running": qq.free_running(ref_gen, qq._generate(llm, prompts, len(ref_gen[0])))}


def run(args: argparse.Namespace) -> int:
    from gpu_worker.llm import LLM

    started = time.perf_counter()
    llm = LLM(args.model, kv_cache_memory=256 << 20)
    model = llm.engine.model
    prompts = [llm.encode([{"role": "user", "content": q}]) for q in (qq.PROMPTS * 4)[:args.prompts]]
    text_ids = llm.tokenizer.encode(qq.TEXT)
    ref_gen = qq._generate(llm, prompts, args.tokens)
    seqs = calibration_sequences(llm.tokenizer, model)
    logger.info("calibration text: %d sequences, %d tokens", len(seqs), sum(map(len, seqs)))
    fake = FakeQuantized(model, seqs)
    logger.info("calibration statistics collected (%.0f s in all)", time.perf_counter() - started)
    fp32 = {"linear_weight_bytes": sum(c.weight.numel() * 4 for _, _, c in fake.layers),
            "lm_head_bytes": fake.head_weight.numel() * 4, "perplexity": qq.perplexity(model, text_ids)}
    result = {"model": llm.engine.model_dir.name, "prompts": len(prompts), "tokens": args.tokens,
              "text_tokens": len(text_ids), "how": "fake quantization in an fp32 model", "fp32": fp32,
              "methods": {}}
    for recipe in [r.strip() for r in args.recipes.split(",") if r.strip()]:
        t0 = time.perf_counter()
        row = fake.apply(recipe)
        quantize_s = time.perf_counter() - t0
        row.update(evaluate(llm, prompts, ref_gen, text_ids), quantize_s=round(quantize_s, 1))
        row["weight_bytes_vs_fp32"] = row["linear_weight_bytes"] / fp32["linear_weight_bytes"]
        fake.restore()
        result["methods"][recipe] = row
        logger.info("%s: %s", recipe, row)
        qq._write(args.json, result)
    result["wall_s"] = time.perf_counter() - started
    qq._write(args.json, result)
    print(qq.table(result))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
