"""One pipeline stage: a contiguous range of decoder layers and only the weights it runs.

The stage's model is a :class:`LlamaForCausalLM` whose config has just this stage's layers
(stage layer i is global layer start + i); the first stage keeps the embedding, the last the
final norm and LM head (and the embedding when they are tied). Everything else is dropped
after loading, so a stage holds its own layers' weights and, through its runner, only their
KV caches.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.model.config import ModelConfig
from gpu_worker.model.llama import LlamaForCausalLM
from gpu_worker.model.ops.onednn import pack_for_cpu
from gpu_worker.model.ops.base import ModelOps

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def split_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """[start, end) per stage, as even as possible (earlier stages get the remainder)."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {num_stages} stages")
    base, extra = divmod(num_layers, num_stages)
    ends = list(itertools.accumulate(base + (s < extra) for s in range(num_stages)))
    return list(zip([0] + ends[:-1], ends))


@dataclass(frozen=True)
class StageSpec:
    rank: int
    num_stages: int
    start: int   # first global layer
    end: int     # one past the last

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.num_stages - 1


def _load_stage_state(model_dir: Path, spec: StageSpec) -> dict[str, torch.Tensor]:
    """The non-layer weights and the stage's layers (renumbered from 0); nothing else is
    read from the safetensors files."""
    from safetensors import safe_open

    state = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                m = _LAYER_KEY.match(name)
                if m is None:
                    state[name] = handle.get_tensor(name)
                elif spec.start <= int(m.group(1)) < spec.end:
                    state[f"model.layers.{int(m.group(1)) - spec.start}.{m.group(2)}"] = handle.get_tensor(name)
    return state


def build_stage_model(model_dir: Path, cfg: ModelConfig, spec: StageSpec, ops: ModelOps,
                      max_positions: int, device: torch.device) -> LlamaForCausalLM:
    stage_cfg = dataclasses.replace(cfg, num_layers=spec.end - spec.start)
    model = LlamaForCausalLM(stage_cfg, ops, max_positions=max_positions)
    model.load_hf_state_dict(_load_stage_state(model_dir, spec))
    unused = nn.Parameter(torch.empty(0), requires_grad=False)
    if not spec.is_last:
        model.norm = model.lm_head = unused
    if not spec.is_first and not (spec.is_last and cfg.tie_word_embeddings):
        model.embed = unused
    model.eval().to(device)
    pack_for_cpu(model)
    return model


@torch.inference_mode()
def run_stage(model: LlamaForCausalLM, spec: StageSpec, x: torch.Tensor | None, residual: torch.Tensor | None,
              input_ids: torch.Tensor | None, positions: torch.Tensor, kv_caches, plan,
              logit_rows: torch.Tensor | None):
    """First stage: embed input_ids. Every stage: its layers. Last stage: returns logits
    [len(logit_rows), vocab] float32; the others return (x, residual) for the next stage."""
    if spec.is_first:
        x, residual = F.embedding(input_ids, model.embed), None
    keep = logit_rows if spec.is_last else None   # the last layer's MLP for these rows only
    x, residual = model.forward_layers(x, residual, positions, kv_caches, plan, 0, len(model.layers), keep)
    if not spec.is_last:
        return x, residual
    hidden = model.ops.add_rms_norm(x, residual, model.norm, model.cfg.rms_norm_eps)[0]
    return model.compute_logits(hidden)
