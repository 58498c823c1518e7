"""Decode steps in one C call per step: the ``cpu`` backend's fused decoder layers.

When every projection of a CPU model is a :class:`CpuPackedLinear` (fp32, bf16, int8 or
int4 tiles) and the ``cpu`` ops backend runs it, :func:`install` gives the model a
:class:`FusedDecode`; ``LlamaForCausalLM.forward_layers`` hands it every step whose rows are
all decode rows (one new token each, the C attention kernel planned), and it runs those
layers through ``kernels.cpu.layers.DecodeLayers``: the same kernels as the per-op path, in
the same order, so the same bits, without ~9 Python-level calls per layer (about a quarter
of a batch-1 step; ``python -m gpu_worker.bench.decode_profile`` shows it). Other steps
(prefill chunks, speculative verification, other backends) keep the per-op path.
"""
from __future__ import annotations

import logging

import torch

from gpu_worker.model.attention import CpuAttentionPlan
from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
from kernels.cpu.layers import DecodeLayers, LayerWeights, Projection, available

logger = logging.getLogger(__name__)


def _projection(m) -> Projection | None:
    return Projection(m.packed, m.bias, m.input_scale) if type(m) is CpuPackedLinear else None


def _revisions(model) -> tuple:
    """The layers' revisions (``DecoderLayer.__setattr__`` counts every swap)."""
    return tuple(layer.__dict__.get("revision", 0) for layer in model.layers)


def _layer_weights(layer) -> LayerWeights | None:
    parts = [_projection(m) for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
    if any(p is None for p in parts) or layer.input_norm.dtype != torch.float32:
        return None
    return LayerWeights(layer.input_norm.detach(), layer.post_norm.detach(), *parts)


class FusedDecode:
    """A model's layers for :class:`DecodeLayers`, packed at :func:`install`. A model whose
    projections or norms are swapped afterwards (a quality benchmark quantizing a loaded
    model) is noticed on its next step: the path is rebuilt, or dropped if it no longer fits."""

    def __init__(self, layers: DecodeLayers, revisions: tuple) -> None:
        self.layers, self.revisions = layers, revisions   # the layers' revisions when packed
        self._refused = False

    def __deepcopy__(self, memo: dict) -> None:
        return None   # a copied model may change its projections: it keeps the per-op path

    @staticmethod
    def takes(x: torch.Tensor, plan) -> bool:
        """The step is all decode rows (a step of short chunks counts: plan_native_attention
        plans their tokens as decode rows), planned for the C attention kernel."""
        return (isinstance(plan, CpuAttentionPlan) and plan.decode_lens is not None and plan.prefill_chunks is None
                and x.shape[0] == plan.decode_rows and x.dtype == torch.float32)

    def current(self, model) -> bool:
        """No projection or norm of the model was swapped since this path was packed."""
        return self.revisions == _revisions(model)

    def __call__(self, model, x, residual, positions, kv_caches, plan: CpuAttentionPlan, start: int):
        """(x, residual) after the layers, or None when the step's tensors are not what the C
        call takes (the caller then runs it op by op)."""
        if not self.current(model):
            logger.info("the model's projections changed: rebuilding its fused decode layers")
            model.fused_decode = None
            install(model)
            return None if model.fused_decode is None else model.fused_decode(
                model, x, residual, positions, kv_caches, plan, start)
        first = residual is None
        x = x.clone(memory_format=torch.contiguous_format)   # the caller's x is not written
        if first:
            residual = torch.empty_like(x)
        try:   # every check runs before the C call: a refused step has written nothing
            self.layers.run(x, residual, first, kv_caches, start, positions, model.cos_table, model.sin_table,
                            plan.meta.slot_mapping, plan.decode_tables, plan.decode_lens, plan.meta.block_size,
                            model.layers[start].scale)
        except ValueError as e:
            if not self._refused:
                self._refused = True
                logger.warning("fused decode layers refused a step (%s); such steps run op by op", e)
            return None
        return x, residual


def install(model) -> bool:
    """Give ``model`` (a LlamaForCausalLM on the ``cpu`` ops backend) its fused decode path
    when all its projections are packed for the CPU kernels; returns whether it did."""
    if model.ops.name != "cpu" or not len(model.layers):
        return False
    weights = [_layer_weights(layer) for layer in model.layers]
    if any(w is None for w in weights):
        return False
    cfg = model.cfg
    try:
        layers = DecodeLayers(weights, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)
    except ValueError as e:
        logger.info("fused decode layers not used: %s", e)
        return False
    if not available(layers.formats):
        return False
    model.fused_decode = FusedDecode(layers, _revisions(model))
    logger.info("decode steps run the %d layers in one C call (%s weights)", len(weights),
                "/".join(sorted(layers.formats)))
    return True
