"""Greedy tokens of an fp32 LM head at about half its cost, with the same tokens.

A greedy row needs the index of its largest logit, not the logits. :class:`GreedyHead`
computes every logit approximately first, with x and W rounded to bf16 (AVX512_BF16 dot
products over a bf16 copy of the head: half the bytes and twice the multiply-adds per
instruction of the fp32 matmul; ``greedy_head.c``), then proves which tokens cannot win:

    |approx_j - fp32_j| <= c |x| |w_j|   for any float32 evaluation fp32_j of x . w_j,

with c = (2 u_bf16 + u_bf16^2 + 2 (K + 8) u_f32) times 1.0625, u the unit roundoffs (2^-8
and 2^-24): each bf16 rounding is within u_bf16 of its operand, float32 sums of K products
are within (K + 8) u_f32 of the exact sum of their absolute values (the +8 covers the
kernels' partial-sum chains), and Cauchy-Schwarz bounds that sum by |x| |w_j|; the last
factor covers the rounding of the norms themselves. Token k with the largest approx puts a
floor approx_k - c |x| |w_k| under the row's fp32 maximum, so every j with approx_j + c |x|
|w_j| below it is strictly smaller than the winner in any float32 evaluation. The few left
(median 1 a row on SmolLM2's real decode states, mean 9.5, at most 259) are recomputed with the
same packed fp32 kernel over the union of candidate columns, whose per-column sums do not
depend on which columns a call holds (``linear.c``): the same bits as the full head's columns.
The first of equal maxima wins, as in ``torch.argmax``, since every tie of the winner is a
candidate. So the token is the one the full fp32 head gives, not an approximation of it.

Calls of up to ``int8_rows`` rows (8 by default) screen over int8 codes of the head instead
(one scale a channel): a quarter of the fp32 bytes, half the bf16's, where a step of few rows
is bound by the head's stream. On CPUs with AVX512_VNNI and no AMX the codes are laid out once,
at load, as vpdpbusd reads them, and x goes as two bytes a value (``linear_digits.c``: integer
sums, no per-call layout; the float path's multiply-adds made 4 and 8 rows compute-bound
there); elsewhere ``linear.c``'s per-channel int8 kernel runs with x in float32. Its bound is
built the same way, from the codes' own residual r_j = s_j q_j - w_j (exact, in float64)
rather than the bf16 roundings:

    |approx_j - fp32_j| <= |x| (|r_j| + c8 (|s_j q_j| + |w_j|)),   c8 = (2 K + 9) u_f32 + 2^-12,

Cauchy-Schwarz on the residual, then every rounding a float32 evaluation could add: the fp32
head's sum of K products, the screen's (K products and the scale applied after the sum; on
the kernel's AMX path from 16 rows, which carries x as two bf16, hi + lo, 2 K products; on
the two-byte path K / 64 + 2 roundings of the folds: hence 2 K + 9), and 2^-12 for x itself:
the two-byte path rounds each x to within 2^-16 (1 + 2^-7) of its group of 64's largest
|x| (half a step of max / 32767, the step and the division rounded in float32), which is at
most 8 (1 + 2^-7) 2^-16 |x| over the row (under 2^-12.98), and hi + lo leave out 2^-18 of each
value. The per-channel part in parentheses is computed once at load, in
float64, rounded up, and the same candidate test applies (on SmolLM2's real decode states:
median 2 candidates a row, mean 4.6, at most 43, with 2^-15 for x before the two-byte path;
the bf16 screen's 2, 2.9 and 22. 196 greedy states of four chat prompts: median 3, mean 5.41,
at most 43 with 2^-12; 3, 5.08 and 35 with 2^-15).

It returns None (the caller then takes the full head) where the screen cannot decide: a
row with a non-finite value or a tiny |x|, more than ``cap`` candidates, or a union too
large to be worth it. On AVX2 CPUs (no AVX-512: no bf16 pass) only the int8 screen runs, so
calls of more than ``int8_rows`` rows are declined too (the engine sets it to 32 there,
``gpu_worker/model/ops/cpu_linear.py``); the candidates' scan (``greedy_head.c``) runs on
either instruction set, and without both, as scalar loops. On AVX-512 CPUs
without AVX512_BF16 the screen widens the bf16 values to float32 and multiplies them there
(:func:`mode` "widened"): the same bytes, so it pays where the head is memory-bound, but the
fp32 head's multiply-adds, so not past a few rows; ``max_rows`` then declines larger calls.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from kernels.cpu import linear as packed_linear
from kernels.cpu import process_kernels
from kernels.quantize import quantize_int8

U_BF16, U_F32 = 2.0 ** -8, 2.0 ** -24
NORM_SLACK = 1.0625   # the bounds' last factor: the rounding of the norms (|x|, |w_j|) themselves
INT8_ROWS = 8      # calls of up to this many rows screen over int8 codes (half the bf16 screen's bytes)
MIN_NORM = 1e-12   # |x| below this, or |w_j| raised to it: vdpbf16ps flushes denormals (absolute errors)


def mode() -> str | None:
    """How the screen's dot products run here: "native" (AVX512_BF16), "widened" (other AVX-512
    CPUs: bf16 widened to float32 multiply-adds), or None (no AVX-512, or no C kernels)."""
    lib = process_kernels()
    return None if lib is None else lib.bf16dot


def on_amx(k: int) -> bool:
    """Whether the screen's pass over K input features runs on the AMX tiles here (an AMX CPU
    whose kernel took them, K a multiple of 32; ``linear_amx.c``): TDPBF16PS, the same bf16
    products summed in float32, so the same bound, at the weights' streaming rate."""
    lib = process_kernels()
    return lib is not None and lib.bf16dot == "native" and lib.amx_rows > 0 and k % 32 == 0 \
        and lib.bf16_dot_tuning() > 0


def int8_available() -> bool:
    """The int8 screen runs here: linear.c's int8 kernel has its fast path (AVX-512 or AVX2)."""
    return process_kernels() is not None and packed_linear.supported("int8")


def available() -> bool:
    """The C kernels built and some screen runs on this CPU: the bf16 pass (:func:`mode`, AVX-512)
    or the int8 screen of few rows (:func:`int8_available`, AVX-512 or AVX2)."""
    return mode() is not None or int8_available()


def pack_pairs(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] float (K even) -> bf16 [ceil(N / 32), K / 2, 32, 2]: each 32-bit lane a pair of
    consecutive k of one channel, as vdpbf16ps reads them; padding channels zero."""
    k = w.shape[1]
    if k % 2:
        raise ValueError(f"the bf16 screen needs an even K, got {k}")
    tiles = packed_linear._tiles(w.detach().to(torch.bfloat16))          # [NT, K, TILE], as pack_w8a8 starts
    return tiles.reshape(-1, k // 2, 2, packed_linear.TILE).transpose(2, 3).contiguous()


def bound_factor(k: int) -> float:
    """c of the module docstring for K input features."""
    return (2 * U_BF16 + U_BF16 ** 2 + 2 * (k + 8) * U_F32) * NORM_SLACK


def int8_channel_bounds(w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per channel, |r_j| + c8 (|s_j q_j| + |w_j|) of the module docstring, rounded up to float32."""
    w64 = w.double()
    what = codes.double() * scale.double()[:, None]   # exact: a float32 times a 7-bit integer
    c8 = (2 * w.shape[1] + 9) * U_F32 + 2.0 ** -12
    b = (what - w64).norm(dim=1) + c8 * (what.norm(dim=1) + w64.norm(dim=1))
    return (b.clamp_min(MIN_NORM) * (1 + 2 ** -20)).float()


def reference_bf16_dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What ``bf16_dot`` computes, in torch: both operands rounded to bf16, products summed in float64."""
    return (x.bfloat16().double() @ w.bfloat16().double().T).float()


class GreedyHead:
    """The greedy token of each row of ``x @ weight.T`` (weight [V, K] float32, also packed as
    ``packed``, the f32 PackedWeight the engine's head computes with)."""

    def __init__(self, weight: torch.Tensor, packed: packed_linear.PackedWeight, cap: int = 1024,
                 max_union: float = 0.125, max_rows: int | None = None, int8_rows: int = INT8_ROWS) -> None:
        if packed.fmt != "f32" or tuple(weight.shape) != (packed.n, packed.k):
            raise ValueError("GreedyHead screens an f32-packed head of the weight's shape")
        self.int8_rows = int8_rows if int8_rows > 0 and int8_available() else 0
        self.bf16 = mode() is not None   # without it (AVX2), calls past int8_rows are declined
        if not self.bf16 and not self.int8_rows:
            raise RuntimeError("the head's screen needs the C kernels, and AVX-512 for its bf16 pass "
                               "or int8_rows > 0 for the int8 screen (AVX-512 or AVX2)")
        # Calls of more rows are declined (argmax None): the full head is as fast there.
        self.max_rows = max_rows if self.bf16 else min(max_rows or self.int8_rows, self.int8_rows)
        self.lib = process_kernels()
        self.weight = weight.detach().float().contiguous()
        self.n, self.k = packed.n, packed.k
        self.pairs = pack_pairs(self.weight) if self.bf16 else None
        norms = self.weight.double().norm(dim=1).clamp_min(MIN_NORM) * (1 + 2 ** -20)
        self.wnorm = norms.float().contiguous()
        self.wmax = float(self.wnorm.max())
        self.c = bound_factor(self.k)
        self.cap, self.max_union = cap, int(max_union * self.n)
        # The int8 screen for calls of up to int8_rows rows (0: none; settable, for A/B runs where
        # the bf16 pass runs) (the codes, 28 MB for SmolLM2, only where it is on at construction).
        self.laid = None
        if self.int8_rows:
            codes, scale = quantize_int8(self.weight)   # one scale a channel, max |w_j| / 127
            self.codes = packed_linear.pack_int8(codes, scale)
            # Laid out for the two-byte path where it runs (then the tiles' codes are not kept).
            self.laid = self.lib.int8_lay(self.codes)
            if self.laid is not None:
                self.codes = dataclasses.replace(self.codes, data=self.codes.data[:0])
            self.wbound8 = int8_channel_bounds(self.weight, codes, scale).contiguous()
            self.wmax8 = float(self.wbound8.max())
        self._rows, self._scratch = 0, {}   # buffers for up to _rows rows, kept: no page faults a step

    def __deepcopy__(self, memo: dict) -> GreedyHead:
        return self   # read-only but for its scratch, which one thread uses at a time (a self-drafter's copy)

    def scratch(self, m: int) -> dict[str, torch.Tensor]:
        """Buffers for m rows: approx [m, V], xpairs, idx [m, cap], count, xnorm and tokens [m]."""
        if m > self._rows:
            self._rows = m
            self._scratch = {"approx": torch.empty(m * self.n), "xpairs": torch.empty(m * self.k, dtype=torch.int32),
                             "idx": torch.empty(m * self.cap, dtype=torch.int64),
                             "count": torch.empty(m, dtype=torch.int64), "xnorm": torch.empty(m),
                             "tokens": torch.empty(m, dtype=torch.int64)}
        s = self._scratch
        return {"approx": s["approx"][:m * self.n].view(m, self.n), "xpairs": s["xpairs"][:m * self.k],
                "idx": s["idx"][:m * self.cap].view(m, self.cap), "count": s["count"][:m],
                "xnorm": s["xnorm"][:m], "tokens": s["tokens"][:m]}

    def approx(self, x: torch.Tensor, bufs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """bf16(x) . bf16(W) [M, V] float32 (the screen's pass; into ``bufs["approx"]`` when given)."""
        if not self.bf16:
            raise RuntimeError("the bf16 pass needs AVX-512: this head screens over int8 codes only")
        x = x.float().contiguous()
        if bufs is None:
            bufs = {"approx": torch.empty(x.shape[0], self.n),
                    "xpairs": torch.empty(x.shape[0] * self.k, dtype=torch.int32)}
        self.lib.bf16_dot(x, self.pairs, self.n, bufs["xpairs"], bufs["approx"])
        return bufs["approx"]

    def _checked(self, x: torch.Tensor) -> torch.Tensor | None:
        """x as float32 [M, K], contiguous; None where this head's screen does not run for M rows."""
        x = x.float().contiguous()
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"x must be [M, {self.k}], got {tuple(x.shape)}")
        return None if x.shape[0] > self.int8_rows and not self.bf16 else x   # the bf16 pass does not run here

    def _screen(self, x: torch.Tensor, bufs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """The screen's pass over x (int8 codes up to int8_rows rows, else bf16): approx and
        the bound's per-channel factors, their largest and the row factor c."""
        if x.shape[0] <= self.int8_rows:
            return self.int8_approx(x, bufs["approx"]), self.wbound8, self.wmax8, NORM_SLACK
        return self.approx(x, bufs), self.wnorm, self.wmax, self.c

    def int8_approx(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] float32 (contiguous) times the int8 codes [M, V]: the int8 screen's pass."""
        out = torch.empty(x.shape[0], self.n) if out is None else out
        if self.laid is not None:
            self.lib.linear_int8_laid(x, self.laid, self.codes, out)   # checked here: x [M, K], out [M, N]
        else:
            self.lib.linear(x, self.codes, None, out)
        return out

    def candidates(self, x: torch.Tensor) -> list[np.ndarray] | None:
        """Each row's candidate token ids (ascending), or None where the screen cannot decide
        (for inspection and tests: :meth:`argmax` runs the same steps in one C call)."""
        x = self._checked(x)
        if x is None:
            return None
        bufs = self.scratch(x.shape[0])
        idx, count, xnorm = bufs["idx"], bufs["count"], bufs["xnorm"]
        if not self.lib.head_xnorm(x, MIN_NORM, xnorm):   # the same step as argmax's C call
            return None
        approx, wbound, wmax, c = self._screen(x, bufs)
        if not self.lib.head_candidates(approx, xnorm, wbound, wmax, c, idx, count):
            return None
        rows, counts = idx.numpy(), count.tolist()
        return [rows[m, :counts[m]].copy() for m in range(len(counts))]   # not views of the scratch

    def argmax(self, x: torch.Tensor) -> list[int] | None:
        """Each row's greedy token, as ``argmax(x @ weight.T)`` through the packed f32 head
        would give it; None where the screen cannot decide (take the full head then). The
        pass, then one C call (``fleet_head_argmax``): |x|, the candidates, their union's
        exact fp32 logits through a packed copy of their columns, each row's largest."""
        if x.shape[0] == 0:
            return []
        if self.max_rows is not None and x.shape[0] > self.max_rows:
            return None
        x = self._checked(x)
        if x is None:
            return None
        bufs = self.scratch(x.shape[0])
        approx, wbound, wmax, c = self._screen(x, bufs)
        if not self.lib.head_argmax(x, approx, wbound, wmax, c, MIN_NORM, self.max_union, self.weight, bufs):
            return None
        return bufs["tokens"].tolist()
