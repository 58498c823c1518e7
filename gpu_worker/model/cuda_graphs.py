"""CUDA graphs for pure-decode steps: capture once per padded batch size, replay per step.

A decode step's cost on a GPU is mostly kernel-launch overhead at small batch sizes, and
its shapes depend only on the number of sequences, so each common size (1, 2, 4, 8, 16,
32, 64, ...) is captured once over static input buffers. A step of n decodes copies its
inputs into the first n rows of the smallest size >= n and pads the rest: slot -1 (the KV
store skips it), context length 0 (the decode kernel returns zeros), token and position 0.
Only the ``triton`` ops can be captured (no host reads of device data).

``DecodeGraphs(..., capture=False)`` runs the same padded static path eagerly: that is how
the padding logic is tested on a CPU under the Triton interpreter.
"""
from __future__ import annotations

import bisect
import logging

import torch

from gpu_worker.model.ops.triton_ops import TritonAttentionPlan

logger = logging.getLogger(__name__)


def default_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 64, then powers of two, capped at max_batch."""
    sizes = [s for s in (1, 2, 4) if s < max_batch]
    s = 8
    while s < max_batch:
        sizes.append(s)
        s = s + 8 if s < 64 else s * 2
    return sizes + [max_batch]


class DecodeGraphs:
    def __init__(self, model, kv_caches, *, max_batch: int, max_blocks_per_seq: int,
                 sizes: list[int] | None = None, capture: bool = True) -> None:
        if model.ops.name != "triton":
            raise ValueError("decode graphs need the triton ops")
        dev = model.embed.device
        self.model, self.kv_caches = model, kv_caches
        self.sizes = sorted(set(sizes or default_sizes(max_batch)))
        b, w = self.sizes[-1], max_blocks_per_seq
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((b,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(b, w, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self._no_prefill = torch.zeros(1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _plan(self, b: int) -> TritonAttentionPlan:
        return TritonAttentionPlan(self.slot_mapping[:b], b, self.block_tables[:b], self.seq_lens[:b],
                                   self.block_tables[:0], self._no_prefill, self.seq_lens[:0], 0)

    def _forward(self, b: int) -> torch.Tensor:  # [b, hidden]
        return self.model(self.input_ids[:b], self.positions[:b], self.kv_caches, self._plan(b))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Largest first, all sizes sharing one memory pool. The static buffers are all
        padding here (slot -1, length 0), so warm-up runs write nothing to the KV cache."""
        pool = None
        for b in reversed(self.sizes):
            self._forward(b)  # compiles kernels and fills host-side caches outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._forward(b)
            pool = graph.pool() if pool is None else pool
            self.graphs[b] = graph
        torch.cuda.synchronize()
        # The graphs read the weights at the addresses they had now: swapping modules later
        # (quantize_model) would leave them reading freed memory, so that is refused.
        self.model.decode_graphs_captured = True
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def can_run(self, meta) -> bool:
        """A step that is all single-token decodes, fits the largest size and the table width."""
        n = len(meta.seq_lens)
        return (meta.num_decodes == n and 0 < n <= self.sizes[-1]
                and meta.block_tables.shape[1] <= self.block_tables.shape[1])

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """Hidden states [n, hidden] of a pure-decode step (``can_run(meta)`` must hold)."""
        n = input_ids.shape[0]
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        self.seq_lens[:n].copy_(torch.tensor(meta.seq_lens, dtype=torch.int32))
        if b > n:   # padding rows: stale table entries are never read at length 0
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
            self.slot_mapping[n:b].fill_(-1)
            self.seq_lens[n:b].zero_()
        if b in self.graphs:
            self.graphs[b].replay()
            return self.outputs[b][:n]
        return self._forward(b)[:n]


def capture_decode_graphs(model, kv_caches, *, max_num_seqs: int, max_model_len: int,
                          block_size: int) -> DecodeGraphs | None:
    """Decode graphs when the model runs the triton ops on a CUDA device, else None."""
    if model.embed.device.type != "cuda" or model.ops.name != "triton":
        return None
    return DecodeGraphs(model, kv_caches, max_batch=max_num_seqs,
                        max_blocks_per_seq=-(-max_model_len // block_size))
