"""Model-based drafters: a separate small draft model, or the target's own first layers
(early exit). Both draft greedily (so the draft distribution is one-hot and verification
stays exact) over the target's block tables, into the lookahead slots the scheduler allocated.

A separate draft model keeps its own paged KV cache with the target's block ids; it runs
on every target batch (``observe``) so its cache always holds the same tokens. The early-
exit drafter's layers *are* the target's first layers, so it shares their KV cache and
needs no observing.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from gpu_worker.model.attention import build_attention_metadata
from gpu_worker.model.llama import LlamaForCausalLM
from gpu_worker.runner import allocate_kv_caches
from gpu_worker.spec.speculator import DraftItem

# (input_ids [n], positions [n], plan) -> each row's greedy token
DraftForward = Callable[[torch.Tensor, torch.Tensor, object], list[int]]


class ModelDrafter:
    """A :class:`~gpu_worker.spec.speculator.Proposer` drafting greedily with a model."""

    uses_model = True

    def __init__(self, name: str, model: LlamaForCausalLM, forward: DraftForward, block_size: int,
                 observe: Callable[[torch.Tensor, torch.Tensor, object], None] | None = None):
        self.name, self.model, self._forward, self.observe = name, model, forward, observe
        self.block_size, self.device = block_size, model.embed.device

    @torch.inference_mode()
    def propose(self, items: list[DraftItem]) -> dict[str, list[int]]:
        """Up to max(k) greedy draft steps; a request's j-th step feeds its previous token
        at position num_tokens - 1 + j."""
        current = {it.request.request_id: it.request.token_ids[-1] for it in items}
        drafts: dict[str, list[int]] = {it.request.request_id: [] for it in items}
        for j in range(max((it.k for it in items), default=0)):
            active = sorted((it for it in items if it.k > j), key=lambda it: it.request.num_tokens)
            positions = [it.request.num_tokens - 1 + j for it in active]
            meta = build_attention_metadata([it.block_ids for it in active], [p + 1 for p in positions],
                                            [1] * len(active), self.block_size, self.device)
            ids = torch.tensor([current[it.request.request_id] for it in active], device=self.device)
            plan = self.model.ops.plan_attention(meta)
            tokens = self._forward(ids, torch.tensor(positions, device=self.device), plan)
            for it, tok in zip(active, tokens):
                drafts[it.request.request_id].append(tok)
                current[it.request.request_id] = tok
        return drafts


def early_exit_drafter(target: LlamaForCausalLM, kv_caches: list, num_layers: int, block_size: int) -> ModelDrafter:
    """The target's first ``num_layers`` layers, then its final norm and head."""
    if not 0 < num_layers < target.cfg.num_layers:
        raise ValueError(f"self-draft layers must be in [1, {target.cfg.num_layers - 1}], got {num_layers}")

    def forward(ids, positions, plan):
        x = torch.nn.functional.embedding(ids, target.embed)
        x, residual = target.forward_layers(x, None, positions, kv_caches[:num_layers], plan, 0, num_layers)
        return greedy(target, target.ops.add_rms_norm(x, residual, target.norm, target.cfg.rms_norm_eps)[0])

    return ModelDrafter("self", target, forward, block_size)


def quantized_self_drafter(target: LlamaForCausalLM, kv_caches: list, method: str, block_size: int,
                           model_dir=None, tokenizer=None, *, cache: bool = True,
                           huge_pages: bool = True) -> ModelDrafter:
    """The target's own weights, weight-only quantized (``int8``/``int4``), reading the
    target's KV cache as its context: no cache or catch-up pass of its own. Drafts are only
    proposals, so the small difference between quantized and exact keys costs acceptance,
    never correctness. On a GPU a draft step moves a quarter (int4) of the target's bytes.
    With the target's ``tokenizer``, INT4 is calibrated as ``--quantization int4`` is (and
    shares its cache, keyed by ``model_dir``): on SmolLM2 its agreement with the target, so
    the drafts' acceptance, rose from 76 % (uncalibrated) to 87 %.

    On the ``cpu`` backend the draft then runs as the target does: its quantized weights on
    huge pages (unless ``huge_pages`` is False; the head it shares with the target stays
    where it is), its decode steps through the fused C layers, and its tokens from the
    target's greedy screen where the two share the head (:func:`greedy`)."""
    import copy

    from gpu_worker.model.quant.cache import quantize_for_serving

    draft = copy.deepcopy(target)
    quantize_for_serving(draft, method, model_dir, tokenizer, cache=cache)
    if draft.greedy_head is not None and not _same_head(draft, target):
        draft.greedy_head = None   # its screen proves the target's head's argmax, not a requantized one's
    if draft.ops.name == "cpu":
        from gpu_worker.model.build import place_and_fuse

        place_and_fuse(draft, huge_pages, shared_with=target)
    return ModelDrafter("self", draft, _whole_model(draft, kv_caches), block_size)


def _same_head(a: LlamaForCausalLM, b: LlamaForCausalLM) -> bool:
    """Both models compute their logits from the same packed head weight."""
    pa, pb = getattr(a, "packed_head", None), getattr(b, "packed_head", None)
    return pa is not None and pb is not None and getattr(pa, "packed", None) is getattr(pb, "packed", False)


def draft_model_drafter(draft: LlamaForCausalLM, num_blocks: int, block_size: int, *,
                        huge_pages: bool = True) -> ModelDrafter:
    """A separate model with its own KV cache over the target's block ids (on the CPU on huge
    pages unless ``huge_pages`` is False, as the target's)."""
    kv = allocate_kv_caches(draft.cfg, num_blocks, block_size, draft.embed.dtype, draft.embed.device,
                            huge_pages=huge_pages)

    def observe(ids, positions, plan):
        draft(ids, positions, kv, plan)

    return ModelDrafter("draft", draft, _whole_model(draft, kv), block_size, observe=observe)


def greedy(model: LlamaForCausalLM, hidden: torch.Tensor) -> list[int]:
    """Each row's argmax of ``model.compute_logits(hidden)``: from the greedy screen where the
    model has one (a few candidates' exact logits instead of the whole head's), else the logits."""
    tokens = model.greedy_tokens(hidden)
    return model.compute_logits(hidden).argmax(dim=-1).tolist() if tokens is None else tokens


def _whole_model(model: LlamaForCausalLM, kv_caches: list) -> DraftForward:
    """Drafting with every layer of ``model`` over ``kv_caches``."""
    return lambda ids, positions, plan: greedy(model, model(ids, positions, kv_caches, plan))
