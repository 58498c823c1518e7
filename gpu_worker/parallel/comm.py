"""Point-to-point messages between pipeline stages (torch.distributed send/recv).

A micro-batch travels down the pipeline as three messages: a fixed-size header, one int64
tensor with the batch layout (each stage rebuilds the attention metadata from it with
``build_attention_metadata``), and the activations ``[2, num_tokens, hidden]`` (hidden
states and residual). The last stage returns the logits of the sampled rows to rank 0.
Messages on one link arrive in the order they were sent; logits carry the micro-batch's
virtual-engine index as their tag, so rank 0 can wait for them in any order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from gpu_worker.model.attention import AttentionMetadata, build_attention_metadata

HEADER_LEN = 8
CMD_STOP, CMD_RUN = 0, 1


@dataclass
class StageBatch:
    """What a non-first stage needs to run its layers over one micro-batch."""

    engine: int                    # virtual engine (micro-batch slot) index
    positions: torch.Tensor        # [num_tokens] int64
    meta: AttentionMetadata
    logit_rows: torch.Tensor       # [num_logit_rows] int64: rows whose logits are wanted
    acts: torch.Tensor             # [2, num_tokens, hidden]: hidden states, residual


def send_batch(dst: int, engine: int, positions: torch.Tensor, meta: AttentionMetadata,
               logit_rows: torch.Tensor, x: torch.Tensor, residual: torch.Tensor) -> list:
    """Post the three messages; returns the pending works (keep them, and their tensors,
    alive until they complete)."""
    dev = x.device
    num_seqs, max_blocks = meta.block_tables.shape
    header = torch.tensor([CMD_RUN, engine, positions.shape[0], num_seqs, max_blocks, meta.num_decodes,
                           logit_rows.shape[0], meta.block_size], dtype=torch.int64, device=dev)
    ints = torch.cat([positions.to(dev), meta.block_tables.reshape(-1).to(dev),
                      torch.tensor(meta.seq_lens + meta.query_lens, dtype=torch.int64, device=dev),
                      logit_rows.to(dev)])
    acts = torch.stack([x, residual])
    return [(dist.isend(t, dst), t) for t in (header, ints, acts)]


def send_stop(dst: int, device: torch.device) -> None:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=device)
    dist.send(header, dst)


def recv_batch(src: int, hidden: int, dtype: torch.dtype, device: torch.device) -> StageBatch | None:
    """Blocking receive of the next micro-batch; None when the pipeline is told to stop."""
    header = torch.empty(HEADER_LEN, dtype=torch.int64, device=device)
    dist.recv(header, src)
    cmd, engine, num_tokens, num_seqs, max_blocks, num_decodes, num_rows, block_size = header.tolist()
    if cmd == CMD_STOP:
        return None
    ints = torch.empty(num_tokens + num_seqs * max_blocks + 2 * num_seqs + num_rows, dtype=torch.int64, device=device)
    dist.recv(ints, src)
    acts = torch.empty(2, num_tokens, hidden, dtype=dtype, device=device)
    dist.recv(acts, src)
    positions, tables, lens, rows = ints.split([num_tokens, num_seqs * max_blocks, 2 * num_seqs, num_rows])
    lens = lens.tolist()
    meta = build_attention_metadata(tables.view(num_seqs, max_blocks).tolist(), lens[:num_seqs], lens[num_seqs:],
                                    block_size, device)
    assert meta.num_decodes == num_decodes, "the stages disagree on the batch layout"
    return StageBatch(engine, positions, meta, rows, acts)


def send_logits(logits: torch.Tensor, engine: int) -> None:
    dist.send(logits.contiguous(), 0, tag=engine)


def post_logits_recv(src: int, engine: int, num_rows: int, vocab: int, device: torch.device):
    """(work, buffer) for the logits [num_rows, vocab] float32 of one micro-batch."""
    buf = torch.empty(num_rows, vocab, dtype=torch.float32, device=device)
    return dist.irecv(buf, src, tag=engine), buf
