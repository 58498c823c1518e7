"""The C matmuls over packed weights (kernels/cpu/linear.c through kernels/cpu/linear.py):
every format, group size, row count (register blocks and the decoded-tile path) and a
channel count that is not a multiple of the tile must agree with the dequantized weight's
float64 product to float32 rounding, with and without bias. On a CPU with AMX, bf16 calls of
many rows round x to bf16 first (linear_amx.c), and the oracle does the same."""
import pytest
import torch
import torch.nn.functional as F

from gpu_worker.model.ops.cpu_linear import cpu_flags
from kernels.cpu import linear as L
from kernels.quantize import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)

FMTS = ("f32", "bf16", "int8", "int4")
pytestmark = pytest.mark.skipif(not all(L.supported(f) for f in FMTS),
                                reason="no C compiler, or neither AVX-512 nor AVX2: linear() is reference_linear there")


def _pack(fmt: str, w: torch.Tensor, group: int | None) -> L.PackedWeight:
    if fmt == "f32":
        return L.pack_f32(w)
    if fmt == "bf16":
        return L.pack_bf16(w)
    if fmt == "int8":
        return L.pack_int8(*quantize_int8(w, group))
    # "int4p": int4 in k pairs (the float path) also where the integer path packs int4 as quads
    return L.pack_int4(*quantize_int4(w, group), group, quads=False if fmt == "int4p" else None)


def _assert_close(y: torch.Tensor, x: torch.Tensor, w: L.PackedWeight, bias: torch.Tensor | None) -> None:
    """Within a float32 summation's rounding of the float64 product of x (rounded to bf16 where
    the kernels do that) and the dequantized weight."""
    pairs = [(xp.double(), wp.double()) for xp, wp in L.operands(x, w)]
    exact = sum(xp @ wp.T for xp, wp in pairs) + (0 if bias is None else bias.double())
    scale = sum(xp.abs() @ wp.abs().T for xp, wp in pairs) + (0 if bias is None else bias.double().abs())
    err = (y.double() - exact).abs()
    assert bool((err <= 2e-6 * scale + 1e-30).all()), f"max err {float(err.max()):.3g}, at scale {float(scale.max()):.3g}"


CASES = [  # (fmt, N, K, group)
    ("f32", 50, 64, None), ("f32", 960, 576, None), ("bf16", 17, 96, None), ("bf16", 576, 1536, None),
    ("int8", 100, 576, None), ("int8", 40, 97, None), ("int8", 33, 576, 32), ("int8", 64, 192, 16),
    ("int8", 576, 1536, 64),
    ("int4", 100, 576, 32), ("int4", 31, 192, 16), ("int4", 70, 576, 64), ("int4", 576, 1536, 128),
    ("int4p", 100, 576, 32), ("int4p", 576, 1536, 128),
]


@pytest.mark.parametrize("fmt,n,k,group", CASES)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 9, 16, 40, 300])
def test_agrees_with_the_dequantized_product(fmt, n, k, group, m):
    gen = torch.Generator().manual_seed(n * 1000 + k + m)
    w = L.pack_f32(torch.randn(n, k, generator=gen)) if fmt == "f32" else \
        _pack(fmt, torch.randn(n, k, generator=gen) * 0.05, group)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if m % 2 else None
    y = L.linear(x, w, bias)
    _assert_close(y, x, w, bias)
    torch.testing.assert_close(y, L.reference_linear(x, w, bias), rtol=1e-4, atol=1e-4)


def _assert_calls_give_the_same_bits(x, w, bias, many, sizes) -> None:
    """Calls of each size over x's rows, the last one ending at the last row, give the rows of
    ``many`` (the whole call's result) bit for bit."""
    m = x.shape[0]
    for size in sizes:
        for r in list(range(0, m - size + 1, size)) + [m - size]:
            assert torch.equal(L.linear(x[r:r + size], w, bias), many[r:r + size]), (size, r)


@pytest.mark.parametrize("n", [960, 100, 96])
@pytest.mark.parametrize("m", [9, 12, 13, 20, 49, 300, 1021])
def test_f32_rows_are_the_same_bits_in_every_call_of_two_rows_or_more(n, m):
    """AVX-512: from 2 rows on, every f32 output is one chain of multiply-adds in k order from
    zero, whatever the call: a block of 2-8 rows, the passes of up to 12 rows past 8, the 6 x 64
    pairs past 48 rows (Intel; with an odd count of pairs and tiles left over, from 128 rows in
    two chunks of rows, so 960 and 100 channels at 300 and 1,021 rows, the latter with a bias,
    take those). So a row gets the same bits in a prefill call as in calls of 2, 3, 4, 5, 8,
    9 or 12 rows. Channel counts with an odd tile (96) and a partial one (100) take the
    single-tile passes in the pairs' calls. AVX2 keeps its blocks of 3 up to 4 rows (two chains
    for a lone row): there calls of 2, 3 and from 5 rows give a big call's bits."""
    gen = torch.Generator().manual_seed(n + m)
    w = L.pack_f32(torch.randn(n, 576, generator=gen))
    x, bias = torch.randn(m, 576, generator=gen), (torch.randn(n, generator=gen) if m % 2 else None)
    many = L.linear(x, w, bias)
    avx2 = not {"avx512f", "avx512bw"} <= cpu_flags()
    sizes = (2, 3, 5, 8, 9, 12) if avx2 else (2, 3, 4, 5, 8, 9, 12)
    _assert_calls_give_the_same_bits(x, w, bias, many, [s for s in sizes if s <= m])


@pytest.mark.skipif(L._library() is None or L._library().simd != "avx512" or L._library().amx_rows,
                    reason="the AVX-512 build's decoded tiles without AMX (with AMX, many rows go to the tiles)")
@pytest.mark.parametrize("fmt,group", [("bf16", None), ("int8", None), ("int8", 64), ("int4", 32), ("int4p", 32)])
@pytest.mark.parametrize("n,m", [(960, 61), (100, 200)])
def test_avx512_decoded_rows_are_the_same_bits_in_every_call_past_eight_rows(fmt, group, n, m):
    """AVX-512 without AMX: past RB (8) rows a bf16, int8 or int4 tile is decoded once into the
    float32 buffer and read by the passes of up to 12 rows that f32 tiles take, one chain of
    multiply-adds a row in k order (a call that ends in a lone row had given it four): so a
    row gets the same bits in calls of 9, 12, 13, 17 or 33 rows as in the whole call."""
    gen = torch.Generator().manual_seed(n + m)
    w = _pack(fmt, torch.randn(n, 576, generator=gen) * 0.05, group)
    x, bias = torch.randn(m, 576, generator=gen), torch.randn(n, generator=gen)
    _assert_calls_give_the_same_bits(x, w, bias, L.linear(x, w, bias), (9, 12, 13, 17, 33))


@pytest.mark.skipif(L._library() is None or L._library().simd != "avx2", reason="the AVX2 build's decoded-tile halves")
@pytest.mark.parametrize("fmt,group,m", [(f, g, m) for f, g in (("bf16", None), ("int8", None), ("int8", 64),
                                                                  ("int4", 32), ("f32", None))
                                          for m in (4, 5, 6, 7, 8, 9, 16, 49) if (f, m) != ("f32", 4)])
def test_avx2_tiles_of_a_few_rows_are_the_bits_of_a_prefill_call(fmt, group, m):
    """AVX2: from 4 rows a bf16, int8 or int4 tile is decoded once into the buffer, and from 5
    rows an f32 tile is copied there (linear.c, HALF_ROWS); halves of 16 channels read it in
    blocks of up to 6 rows of near-equal size, prefetching the next tile up to 48 rows, as in
    a call of hundreds of rows: every row is one chain of multiply-adds in k order, so the
    same bits (f32 at 4 rows takes the 3-row blocks, whose lone last row sums in two chains).
    int8 at 4-8 rows and int4 at 4-5 decode each half in registers instead (codes_tile_rows):
    the same weights and chains, so the same bits again."""
    gen = torch.Generator().manual_seed(m * 10 + len(fmt))
    w = _pack(fmt, torch.randn(100, 576, generator=gen) * 0.05, group)
    x, bias = torch.randn(300, 576, generator=gen), torch.randn(100, generator=gen)
    assert torch.equal(L.linear(x[:m], w, bias), L.linear(x, w, bias)[:m])


@pytest.mark.parametrize("knob", ["prefetch_far", "f32_pairs", "wide_prefetch", "one_row_prefetch", "codes_halves"])
def test_the_cpu_tunings_change_speed_only(knob):
    """Where the matmuls prefetch (L2 and further ahead on Intel, L1 on AMD; one-row calls
    ahead of their own stream, over bf16 and int8 codes or, in AVX2 builds, int8, int4 and
    W8A8; f32 calls of 25-48 rows the next tile), whether f32 past 48 rows takes the 6 x 64 blocks (Intel) or
    the 8 x 32 ones, and whether AVX2 decodes int8 / int4 tiles of a few rows in registers or
    into the buffer: every result is the same bits either way, and the setting reads back."""
    gen = torch.Generator().manual_seed(7)
    small = torch.randn(96, 576, generator=gen) * 0.05
    w = {"f32": L.pack_f32(torch.randn(100, 576, generator=gen)),
         "int4": L.pack_int4(*quantize_int4(small, 32), 32), "bf16": L.pack_bf16(small),
         "int4p": L.pack_int4(*quantize_int4(small, 32), 32, quads=False),
         "int8": L.pack_int8(*quantize_int8(small)), "int8g64": L.pack_int8(*quantize_int8(small, 64))}
    w8a8 = L.pack_w8a8(*quantize_int8(small)) if L.w8a8_supported() else None
    x = torch.randn(300, 576, generator=gen)
    previous = L.tuning()
    runs = {}
    try:
        for value in (False, True):
            simd = L._library().simd
            if knob == "codes_halves":   # AVX2 builds only
                expected = value and simd == "avx2"
            else:   # AVX2 builds have the one-row prefetch only
                expected = value and bool(previous) and (simd == "avx512" or knob == "one_row_prefetch")
            assert L.tuning(**{knob: value})[knob] is expected
            runs[value] = {(f, m): L.linear(x[:m], p) for f, p in w.items()
                           for m in (1, 2, 3, 4, 5, 8, 12, 30, 40, 49, 300)}
            if w8a8 is not None:
                runs[value].update({("w8a8", m): L.linear_w8a8(x[:m], w8a8) for m in (1, 2, 8)})
    finally:
        L.tuning(**previous)
    assert all(torch.equal(runs[False][k], runs[True][k]) for k in runs[False])


def _amx_rows() -> int:
    lib = L._library()
    return lib.amx_rows if lib is not None else 0


@pytest.mark.skipif(not _amx_rows(), reason="this CPU (or build) has no AMX: bf16 keeps the AVX-512 path")
@pytest.mark.parametrize("m", [16, 40, 300])
def test_amx_rounds_x_to_bf16_from_its_row_count_and_only_there(m):
    gen = torch.Generator().manual_seed(m)
    w = L.pack_bf16(torch.randn(70, 576, generator=gen) * 0.05)
    x, bias = torch.randn(max(m, _amx_rows()), 576, generator=gen), torch.randn(70, generator=gen)
    wd = L.dequantize(w)
    torch.testing.assert_close(L.linear(x, w, bias), F.linear(x.bfloat16().float(), wd, bias), rtol=1e-5, atol=1e-5)
    few = x[:_amx_rows() - 1]   # below the AMX row count: x is used as it is
    torch.testing.assert_close(L.linear(few, w, bias), F.linear(few, wd, bias), rtol=1e-5, atol=1e-5)
    odd = L.pack_bf16(torch.randn(70, 80, generator=gen))   # K not a multiple of 32: no AMX either
    x80 = torch.randn(m, 80, generator=gen)
    torch.testing.assert_close(L.linear(x80, odd), F.linear(x80, L.dequantize(odd)), rtol=1e-5, atol=1e-5)


def test_out_is_written_and_rows_zero_work():
    w = L.pack_int8(*quantize_int8(torch.randn(40, 64), 16))
    x, out = torch.randn(5, 64), torch.full((5, 40), float("nan"))
    assert L.linear(x, w, out=out) is out
    _assert_close(out, x, w, None)
    assert L.linear(torch.empty(0, 64), w).shape == (0, 40)


def test_packing_round_trips_to_the_canonical_dequantizers():
    w = torch.randn(45, 128)
    assert torch.equal(L.dequantize(L.pack_f32(w)), w)
    assert torch.equal(L.dequantize(L.pack_bf16(w)), w.to(torch.bfloat16).float())
    for group in (None, 32):
        q, s = quantize_int8(w, group)
        assert torch.equal(L.dequantize(L.pack_int8(q, s)), dequantize_int8(q, s))
    p, s, mn = quantize_int4(w, 64)
    assert torch.equal(L.dequantize(L.pack_int4(p, s, mn, 64)), dequantize_int4(p, s, mn, 64))
    torch.testing.assert_close(L.reference_linear(torch.ones(2, 128), L.pack_f32(w)), F.linear(torch.ones(2, 128), w))


def test_refuses_what_it_does_not_take():
    w = L.pack_f32(torch.randn(32, 64))
    for x in (torch.randn(64, 3).T, torch.randn(3, 64, dtype=torch.float64), torch.randn(3, 48)):
        with pytest.raises(ValueError):
            L.linear(x, w)
    with pytest.raises(ValueError):
        L.linear(torch.randn(3, 64), w, bias=torch.randn(31))
    with pytest.raises(ValueError):
        L.pack_int8(*quantize_int8(torch.randn(8, 96), 24))       # 24 is not a multiple of 16
    with pytest.raises(ValueError):
        L.pack_int4(*quantize_int4(torch.randn(8, 64), 64), 64)   # per-channel int4


@pytest.mark.skipif(not L.w8a8_supported(), reason="no W8A8 kernel (AVX512_VNNI or AVX2)")
@pytest.mark.parametrize("n,k,m,group", [(70, 576, 40, None), (576, 1536, 64, None), (40, 96, 17, None),
                                         (70, 576, 40, 64), (576, 1536, 64, 32), (40, 96, 17, 16)])
def test_w8a8_rows_do_not_depend_on_the_batch(n, k, m, group):
    """Each row's result is the same bits whether it comes alone (register blocks) or in a
    batch of many rows (the AMX tiles, where the CPU has them): the int32 sums are exact, and a
    grouped row's float sum over its groups runs in one order."""
    gen = torch.Generator().manual_seed(n + k + m)
    p = L.pack_w8a8(*quantize_int8(torch.randn(n, k, generator=gen) * 0.05), group)
    x, bias = torch.randn(m, k, generator=gen) * 3, torch.randn(n, generator=gen)
    alone = torch.cat([L.linear_w8a8(x[r:r + 1], p, bias) for r in range(m)])
    assert torch.equal(L.linear_w8a8(x, p, bias), alone)


@pytest.mark.skipif(not L.w8a8_supported(), reason="no W8A8 kernel (AVX512_VNNI or AVX2)")
@pytest.mark.parametrize("n,k,m", [(50, 64, 1), (100, 576, 3), (576, 1536, 9), (33, 576, 300), (960, 576, 8)])
def test_w8a8_agrees_with_its_reference_and_stays_near_fp32(n, k, m):
    gen = torch.Generator().manual_seed(n + k + m)
    w, x, bias = torch.randn(n, k, generator=gen) * 0.05, torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
    p = L.pack_w8a8(*quantize_int8(w))
    assert torch.equal(L.dequantize(p), L.dequantize(L.pack_int8(*quantize_int8(w))))
    y = L.linear_w8a8(x, p, bias)
    _assert_close(y, L.quantize_rows(x), p, bias)     # exact int32 sums, float32 scaling
    fp32 = F.linear(x, w, bias)
    assert float((y - fp32).norm() / fp32.norm()) < 0.02      # int8 weights and activations: ~1 % here
    with pytest.raises(ValueError):
        L.linear_w8a8(x, L.pack_int8(*quantize_int8(w)))
    with pytest.raises(ValueError):
        L.linear(x, p)
    with pytest.raises(ValueError):
        L.pack_w8a8(*quantize_int8(torch.randn(8, 40)))      # K % 16 != 0
    codes, scale = quantize_int8(w)
    codes[0, 0] = -128                                          # outside quantize_int8's range
    with pytest.raises(ValueError, match="-127, 127"):
        L.pack_w8a8(codes, scale)


@pytest.mark.skipif(not L.w8a8_supported(), reason="no W8A8 kernel (AVX512_VNNI or AVX2)")
@pytest.mark.parametrize("n,k,m,group", [(50, 64, 1, 16), (100, 576, 3, 64), (576, 1536, 9, 32),
                                         (33, 576, 300, 64), (960, 576, 8, 192)])
def test_grouped_w8a8_agrees_with_its_reference_and_keeps_quiet_groups_fine(n, k, m, group):
    """One activation scale per group of input features (``w8a8-a<G>``): the kernel computes
    quantize_rows(x, group) W^T up to float32 rounding, and a loud input channel coarsens
    only its own group, so the product is nearer fp32 than with one scale a row."""
    gen = torch.Generator().manual_seed(n + k + m + group)
    w, x, bias = torch.randn(n, k, generator=gen) * 0.05, torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
    x[:, 3] *= 60                                               # the loud channel every LLM has
    p, per_row = L.pack_w8a8(*quantize_int8(w), group), L.pack_w8a8(*quantize_int8(w))
    assert p.group == group and tuple(p.mins.shape) == (-(-n // L.TILE), k // group, L.TILE)
    y = L.linear_w8a8(x, p, bias)
    _assert_close(y, L.quantize_rows(x, group), p, bias)
    fp32 = F.linear(x, L.dequantize(p), bias)                   # the weights' own rounding set apart
    err_group = float((y - fp32).norm() / fp32.norm())
    err_row = float((L.linear_w8a8(x, per_row, bias) - fp32).norm() / fp32.norm())
    assert err_group < 0.7 * err_row, (err_group, err_row)   # 0.15-0.55x here: the fewer groups, the less
    for bad in (8, 24, k + 16):                                 # not a multiple of 16, or not dividing K
        with pytest.raises(ValueError, match="activation group"):
            L.pack_w8a8(*quantize_int8(w), bad)


def test_instructions_name_what_computes_each_format_here(monkeypatch):
    """What the engine logs per format: the build's vector instructions (W8A8: VNNI's or AVX2's
    integer dot product), AMX where it takes over, the torch reference where nothing runs."""
    lib = L._library()
    simd = {"avx512": "AVX-512", "avx2": "AVX2"}[lib.simd]
    for fmt in FMTS:
        assert f"{simd} float32 FMAs" in L.instructions(fmt)
    assert ("AMX" in L.instructions("bf16")) == bool(lib.amx_rows)
    assert ("AMX" in L.instructions("int8")) == bool(lib.amx_split_rows["int8"])
    if L.w8a8_supported():
        assert ("vpdpbusd" if lib.simd == "avx512" else "vpmaddubsw") in L.instructions("w8a8")
        assert ("AMX" in L.instructions("w8a8")) == bool(lib.amx_w8a8_rows)
        if lib.amx_w8a8_rows:   # the row count comes from the library (linear.h's AMX_W8A8_ROWS), not a copy
            assert f"{lib.amx_w8a8_rows} rows or more" in L.instructions("w8a8")
    assert (lib.amx_w8a8_rows > 0) == (lib.amx_rows > 0)   # both need the AMX tiles
    monkeypatch.setattr(L, "supported", lambda fmt: False)
    assert L.instructions("int8").startswith("the torch reference")
