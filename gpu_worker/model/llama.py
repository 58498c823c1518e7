"""The Llama-family decoder (Llama, Mistral, Qwen2) over a flat, unpadded token batch.

One forward pass mixes prefill chunks of some requests with decode tokens of others; the
attention metadata and the KV caches are passed in explicitly (no global context).
q/k/v and gate/up projections are fused into one matmul each at load time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.errors import ModelLoadError
from gpu_worker.model.attention import CpuAttentionPlan, cpu_paged_attention
from gpu_worker.model.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # ([num_blocks, block_size, kv_heads, head_dim],) * 2


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama semantics: normalise in float32, cast back, then scale."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim]; cos/sin: [num_tokens, 1, head_dim] (rotate-half style)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.input_norm = nn.Parameter(torch.empty(h), requires_grad=False)
        self.post_norm = nn.Parameter(torch.empty(h), requires_grad=False)
        self.qkv = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, h), requires_grad=False)
        self.qkv_bias = (nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size), requires_grad=False)
                         if cfg.attention_bias else None)
        self.o_proj = nn.Parameter(torch.empty(h, self.q_size), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(2 * cfg.intermediate_size, h), requires_grad=False)
        self.down = nn.Parameter(torch.empty(h, cfg.intermediate_size), requires_grad=False)

    def forward(
        self,
        x: torch.Tensor,            # [num_tokens, hidden]
        residual: torch.Tensor,     # [num_tokens, hidden]
        cos: torch.Tensor,          # [num_tokens, 1, head_dim]
        sin: torch.Tensor,          # [num_tokens, 1, head_dim]
        kv_cache: KVCache,
        plan: CpuAttentionPlan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        residual = x if residual is None else x + residual
        h = rms_norm(residual, self.input_norm, eps)
        qkv = F.linear(h, self.qkv, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        n = x.shape[0]
        q = apply_rope(q.view(n, cfg.num_heads, cfg.head_dim), cos, sin)
        k = apply_rope(k.view(n, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
        o = cpu_paged_attention(q, k, v, kv_cache[0], kv_cache[1], plan, cfg.head_dim ** -0.5)
        x = F.linear(o.view(n, self.q_size), self.o_proj)
        residual = x + residual
        h = rms_norm(residual, self.post_norm, eps)
        gate, up = F.linear(h, self.gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
        self.lm_head = (self.embed if cfg.tie_word_embeddings
                        else nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False))
        freqs = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)[:, None] * cfg.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_table", emb.cos() * cfg.rope_attention_scaling, persistent=False)
        self.register_buffer("sin_table", emb.sin() * cfg.rope_attention_scaling, persistent=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,    # [num_tokens] int64
        positions: torch.Tensor,    # [num_tokens] int64
        kv_caches: list[KVCache],
        plan: CpuAttentionPlan,
    ) -> torch.Tensor:              # [num_tokens, hidden]
        x = F.embedding(input_ids, self.embed)
        cos = self.cos_table.index_select(0, positions).to(x.dtype).unsqueeze(1)
        sin = self.sin_table.index_select(0, positions).to(x.dtype).unsqueeze(1)
        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, cos, sin, kv, plan)
        return rms_norm(x + residual, self.norm, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab] float32
        return F.linear(hidden, self.lm_head).float()

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
                layer.qkv.copy_(torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
                if layer.qkv_bias is not None:
                    layer.qkv_bias.copy_(torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
                layer.o_proj.copy_(take(p + "self_attn.o_proj.weight"))
                layer.gate_up.copy_(torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]))
                layer.down.copy_(take(p + "mlp.down_proj.weight"))
