"""The Llama-family decoder (Llama, Mistral, Qwen2) over a flat, unpadded token batch.

One forward pass mixes prefill chunks of some requests with decode tokens of others; the
attention metadata and the KV caches are passed in explicitly (no global context). The
compute ops come from one :class:`ModelOps` chosen at construction (``model/ops``). q/k/v and
gate/up projections are fused into one matmul each; every projection is an ``ops.base.Linear``
that oneDNN packing or weight-only quantization (``model/quant``) swaps at load.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.errors import ModelLoadError
from gpu_worker.model.config import ModelConfig
from gpu_worker.model.ops.base import Linear, ModelOps
from gpu_worker.model.ops.torch_ops import TORCH_OPS

KVCache = tuple[torch.Tensor, torch.Tensor]  # ([num_blocks, block_size, kv_heads, head_dim],) * 2


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.k_start, self.v_start = cfg.num_heads, cfg.num_heads + cfg.num_kv_heads   # head index of k, of v
        self.scale = d ** -0.5
        self.input_norm = nn.Parameter(torch.empty(h), requires_grad=False)
        self.post_norm = nn.Parameter(torch.empty(h), requires_grad=False)
        self.qkv = Linear(self.q_size + 2 * self.kv_size, h, bias=cfg.attention_bias)
        self.o_proj = Linear(h, self.q_size)
        self.gate_up = Linear(2 * cfg.intermediate_size, h)
        self.down = Linear(h, cfg.intermediate_size)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        # Counts swapped projections and norms: a fused decode path (ops/cpu_fused.py) packed
        # from the old ones notices on its next step.
        self.__dict__["revision"] = self.__dict__.get("revision", 0) + 1

    def forward(
        self,
        ops: ModelOps,
        x: torch.Tensor,                # [num_tokens, hidden]
        residual: torch.Tensor | None,  # [num_tokens, hidden]
        rope_ctx,
        kv_cache: KVCache,
        plan,
        keep: torch.Tensor | None = None,   # [m] int64: the only rows wanted past attention, or None: all
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, eps, n = self.cfg, self.cfg.rms_norm_eps, x.shape[0]
        h, residual = ops.add_rms_norm(x, residual, self.input_norm, eps)
        heads = self.qkv(h).view(n, -1, cfg.head_dim)   # [n, heads + 2 * kv_heads, head_dim]: q | k | v
        q, k = ops.rope(heads[:, :self.k_start], heads[:, self.k_start:self.v_start], rope_ctx)
        o = ops.attention(q, k, heads[:, self.v_start:], kv_cache[0], kv_cache[1], plan, self.scale)
        if keep is not None:   # every row's K/V is stored above; the rest of the layer for the kept rows only
            o, residual, n = o.index_select(0, keep), residual.index_select(0, keep), keep.shape[0]
        h, residual = ops.add_rms_norm(self.o_proj(o.reshape(n, self.q_size)), residual, self.post_norm, eps)
        return self.down(ops.gated_mlp(self.gate_up, h)), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: ModelOps = TORCH_OPS, max_positions: int | None = None) -> None:
        super().__init__()
        self.cfg, self.ops = cfg, ops
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.lm_head = (self.embed if cfg.tie_word_embeddings
                        else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False))
        self.packed_head: nn.Module | None = None   # lm_head prepacked for oneDNN (model/ops/onednn.py)
        self.fused_decode = None   # all-decode steps in one C call, when installed (model/ops/cpu_fused.py)
        self.greedy_head = None    # greedy tokens without the full logits, when installed (ops/cpu_linear.py)
        n_pos = min(max_positions or cfg.max_position_embeddings, cfg.max_position_embeddings)
        freqs = torch.arange(n_pos, dtype=torch.float32)[:, None] * cfg.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_table", emb.cos() * cfg.rope_attention_scaling, persistent=False)
        self.register_buffer("sin_table", emb.sin() * cfg.rope_attention_scaling, persistent=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,    # [num_tokens] int64
        positions: torch.Tensor,    # [num_tokens] int64
        kv_caches: list[KVCache],   # one per layer of this model (or stage)
        plan,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:              # [num_tokens, hidden] (keep: [len(keep), hidden]), final-normed
        """keep: the rows whose hidden states are wanted (int64 [m]; the rows that produce
        logits), or None for all. The last layer then runs its output projection and MLP for
        those rows only (forward_layers, which says how their values compare)."""
        x = F.embedding(input_ids, self.embed)
        x, residual = self.forward_layers(x, None, positions, kv_caches, plan, 0, len(self.layers), keep)
        return self.ops.add_rms_norm(x, residual, self.norm, self.cfg.rms_norm_eps)[0]

    @torch.inference_mode()
    def forward_layers(self, x, residual, positions, kv_caches, plan, start: int, end: int,
                       keep: torch.Tensor | None = None):
        """Layers [start, end) only (a pipeline stage); kv_caches[i] belongs to layer start+i.
        keep (rows, as in forward; only for a range that ends at the model's last layer, since
        later layers would need every row): past the attention of layer end - 1 (which stores
        every row's K/V) only the kept rows go on, and x and residual come back with those rows
        alone. A row's values do not depend on the others': the projections and the glue
        compute each row on its own (but for the C matmuls' blocks of at most four rows, which
        sum in more chains: ulp-level)."""
        if self.fused_decode is not None and self.fused_decode.takes(x, plan):
            out = self.fused_decode(self, x, residual, positions, kv_caches[:end - start], plan, start)
            if out is not None:
                return out if keep is None else (out[0].index_select(0, keep), out[1].index_select(0, keep))
        rope_ctx = self.ops.prepare_rope(positions, self.cos_table, self.sin_table)
        last = end - start - 1
        for i, (layer, kv) in enumerate(zip(self.layers[start:end], kv_caches)):
            x, residual = layer(self.ops, x, residual, rope_ctx, kv, plan, keep if i == last else None)
        return x, residual

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] float32
        if self.packed_head is not None:
            return self.packed_head(hidden).float()
        return F.linear(hidden, self.lm_head).float()

    @torch.inference_mode()
    def greedy_tokens(self, hidden: torch.Tensor) -> list[int] | None:
        """Each row's argmax of ``compute_logits(hidden)`` (the first of ties), where the greedy
        head (``kernels/cpu/greedy_head.py``) decides it without the full logits; else None."""
        return None if self.greedy_head is None else self.greedy_head.argmax(hidden)

    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named weights in, fusing q/k/v and gate/up."""
        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise ModelLoadError(f"weight {name} missing from checkpoint")
            return state[name]

        with torch.no_grad():
            self.embed.copy_(take("model.embed_tokens.weight"))
            self.norm.copy_(take("model.norm.weight"))
            if not self.cfg.tie_word_embeddings:
                self.lm_head.copy_(take("lm_head.weight"))
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                layer.input_norm.copy_(take(p + "input_layernorm.weight"))
                layer.post_norm.copy_(take(p + "post_attention_layernorm.weight"))
                layer.qkv.weight.copy_(torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
                if layer.qkv.bias is not None:
                    layer.qkv.bias.copy_(torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
                layer.o_proj.weight.copy_(take(p + "self_attn.o_proj.weight"))
                layer.gate_up.weight.copy_(torch.cat([take(p + "mlp.gate_proj.weight"),
                                                      take(p + "mlp.up_proj.weight")]))
                layer.down.weight.copy_(take(p + "mlp.down_proj.weight"))
