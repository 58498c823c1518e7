"""Per-channel int8 calls past eight rows, and int4 (groups of 32 or more, packed as quads) at
every row count, on CPUs with AVX512_VNNI and no AMX (kernels/cpu/linear_digits.c): x carried
as two bytes a value over groups of 64 input features (32 for int4 in groups of 32), the
products as exact integer dot products. The tests set the row count from which int8 takes
the path (``digit_rows``) and put it back."""
import pytest
import torch

from kernels.cpu import linear as L
from kernels.quantize import quantize_int4, quantize_int8

LIB = L._library()
pytestmark = pytest.mark.skipif(LIB is None or not LIB.digit_rows(),
                                reason="the two-byte int8 path needs AVX512_VNNI without AMX")


@pytest.fixture
def every_call():
    """The path for every call of one row or more; the default back afterwards."""
    before = LIB.digit_rows()
    LIB.digit_rows(1)
    yield
    LIB.digit_rows(before)


def _int8(n: int, k: int, gen: torch.Generator) -> L.PackedWeight:
    return L.pack_int8(*quantize_int8(torch.randn(n, k, generator=gen) * 0.05, None))


def _weight(fmt: str, n: int, k: int, gen: torch.Generator) -> L.PackedWeight:
    """int8 per channel; int4 in groups of 128 or 64 (x groups of 64); int4-g32 (x groups of 32)."""
    if fmt == "int8":
        return _int8(n, k, gen)
    group = 32 if fmt == "int4-g32" else 128 if k % 128 == 0 and k > 128 else 64
    return L.pack_int4(*quantize_int4(torch.randn(n, k, generator=gen) * 0.05, group), group)


def test_the_default_takes_calls_past_the_register_block():
    """int8 from 9 rows (past the 8-row register block, where the float path decodes a tile
    into its buffer), int4 quads at every row count, and the engine's log says so."""
    assert LIB.digit_rows() == 9 == L.digit_rows()
    assert "per channel from 9 rows AVX512_VNNI integer dot products" in L.instructions("int8")
    assert "in groups of 32 or more: AVX512_VNNI integer dot products (vpdpbusd) at every row count" \
        in L.instructions("int4")
    with pytest.raises(ValueError):
        LIB.digit_rows(-1)


def test_int4_in_groups_of_32_or_more_is_packed_as_quads():
    """pack_int4 lays the codes out as vpdpbusd takes them where this path runs: byte [j, h, c, i]
    of a tile holds k = 8 j + i of channel 16 h + c in its low nibble, k = 8 j + 4 + i in its
    high one; the same weight as the k-pair layout, which groups of 16 keep (asking for quads
    there is an error)."""
    gen = torch.Generator().manual_seed(11)
    n, k = 40, 64
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    ones, zeros = torch.ones(n, 2), torch.zeros(n, 2)
    w = L.pack_int4(packed, ones, zeros, 32)
    assert w.quads and tuple(w.data.shape) == (2, 8, 2, 16, 4)
    for j, h, c, i in [(0, 0, 0, 0), (3, 1, 7, 2), (7, 0, 15, 3), (5, 1, 0, 1)]:
        byte = int(w.data[0, j, h, c, i])
        assert byte & 15 == codes[16 * h + c, 8 * j + i] and byte >> 4 == codes[16 * h + c, 8 * j + 4 + i]
    assert int(w.data[1, 0, 0, 8, 0]) == 0   # channel 40, past N: padding
    pairs = L.pack_int4(packed, ones, zeros, 32, quads=False)
    assert not pairs.quads and torch.equal(L.dequantize(w), L.dequantize(pairs))
    assert torch.equal(L.dequantize(w), codes.float())
    assert not L.pack_int4(packed, torch.ones(n, 4), torch.zeros(n, 4), 16).quads
    with pytest.raises(ValueError, match="quads"):
        L.pack_int4(packed, torch.ones(n, 4), torch.zeros(n, 4), 16, quads=True)


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8])
def test_int4_quads_take_every_row_count_whatever_digit_rows_says(group, m):
    """At the default, one row to eight included, and with int8's threshold off: the digits
    oracle, not the float path's products."""
    gen = torch.Generator().manual_seed(group + m)
    w = _weight("int4-g32" if group == 32 else "int4", 70, 1536, gen)
    assert w.quads and L.takes_digits(w)
    x = torch.randn(m, 1536, generator=gen)
    y = L.linear(x, w)
    xd = L.digits(x, L.digit_group(w))
    exact = xd.double() @ L.dequantize(w).double().T
    scale = xd.double().abs() @ L.dequantize(w).double().abs().T
    assert bool(((y.double() - exact).abs() <= 2e-6 * scale + 1e-30).all())
    LIB.digit_rows(0)
    try:
        assert torch.equal(L.linear(x, w), y)
    finally:
        LIB.digit_rows(9)


@pytest.mark.parametrize("m", [1, 3, 6, 7, 13, 40])
def test_the_quads_speed_tunings_change_no_result(m):
    """The prefetch off, at the CPU's default and far ahead (past the tile's end included); the
    nibbles split into a buffer from 7 rows, from every row, or never: the same bits."""
    gen = torch.Generator().manual_seed(m)
    w = _weight("int4-g32", 96, 576, gen)
    x = torch.randn(m, 576, generator=gen)
    assert L.quads_prefetch(-1) > 0 and L.quads_prefetch() % 64 == 0
    assert L.quads_split(-1) in (0, 7)
    ys = []
    try:
        for split in (0, 1, 7):
            for nbytes in (0, 100_000, -1):
                L.quads_split(split), L.quads_prefetch(nbytes)
                ys.append(L.linear(x, w))
        assert L.quads_prefetch(0) == 0 and L.quads_prefetch(1000) == 960
    finally:
        L.quads_prefetch(-1), L.quads_split(-1)
    assert all(torch.equal(ys[0], y) for y in ys[1:])
    with pytest.raises(ValueError):
        LIB.quads_prefetch(-2)
    with pytest.raises(ValueError):
        LIB.quads_split(-2)


@pytest.mark.parametrize("fmt", ["int8", "int4", "int4-g32"])
@pytest.mark.parametrize("n,k", [(100, 576), (33, 64), (70, 1536), (32, 128)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 13, 64])
def test_agrees_with_the_float64_product_of_its_operands(every_call, fmt, n, k, m):
    """Within float32 rounding of the float64 product of digits(x) and the dequantized weight
    (the oracle of every kernel test: linear.operands), partial tiles, bias and blocks of 1-6
    rows included; int4 in groups of 32, 64 and 128 (each x group inside one weight group)."""
    if fmt == "int4" and k == 64:
        pytest.skip("int4 needs groups smaller than K")
    gen = torch.Generator().manual_seed(n + k + m)
    w = _weight(fmt, n, k, gen)
    x = torch.randn(m, k, generator=gen)
    x[0, k // 3] = 60.0   # a loud channel coarsens its own group only
    bias = torch.randn(n, generator=gen) if m % 2 else None
    y = L.linear(x, w, bias)
    (xd, wd), = L.operands(x, w)
    assert torch.equal(xd, L.digits(x, 32 if fmt == "int4-g32" else 64))
    exact = xd.double() @ wd.double().T + (0 if bias is None else bias.double())
    scale = xd.double().abs() @ wd.double().abs().T + (0 if bias is None else bias.double().abs())
    err = (y.double() - exact).abs()
    assert bool((err <= 2e-6 * scale + 1e-30).all()), float(err.max())
    # the two bytes keep x far finer than int8 keeps w: within 1e-3 of the plain float product
    torch.testing.assert_close(y, x @ L.dequantize(w).T + (0 if bias is None else bias), rtol=0, atol=2e-3)


def test_the_integer_sums_are_exact(every_call):
    """x already on the grid (integers, each group's largest 32767, so the scale is 1) and a
    scale of 1 a channel: every output is the exact integer sum (below 2^24, so float32 holds
    it), which the high byte, the low byte and the offset's correction must give together."""
    gen = torch.Generator().manual_seed(7)
    m, n, k = 10, 40, 128
    x = torch.randint(-32767, 32768, (m, k), generator=gen)
    x[:, 0], x[:, 64] = 32767, -32767
    codes = torch.randint(-1, 2, (n, k), generator=gen, dtype=torch.int8)
    y = L.linear(x.float(), L.pack_int8(codes, torch.ones(n)))
    assert torch.equal(y.double(), (x.double() @ codes.double().T))


@pytest.mark.parametrize("fmt", ["int8", "int4", "int4-g32"])
def test_a_bad_row_is_nan_and_leaves_the_others_alone(every_call, fmt):
    gen = torch.Generator().manual_seed(3)
    w = _weight(fmt, 50, 192, gen)
    x = torch.randn(12, 192, generator=gen)
    clean = L.linear(x, w)
    x[4, 100], x[7, 5] = float("nan"), float("inf")
    y = L.linear(x, w)
    assert bool(y[[4, 7]].isnan().all())
    keep = [r for r in range(12) if r not in (4, 7)]
    assert torch.equal(y[keep], clean[keep])


@pytest.mark.parametrize("fmt,k", [("int8", 96), ("int8", 576), ("int4", 576), ("int4", 1536), ("int4-g32", 576)])
def test_a_row_gets_the_same_bits_in_every_call_it_takes(fmt, k):
    """At the default threshold: calls of 9-64 rows give a row the bits of the whole call,
    K = 96 (not a multiple of 64: the float path), 576 and 1,536; int4 quads calls of 1-8
    rows too."""
    gen = torch.Generator().manual_seed(k)
    w = _weight(fmt, 96, k, gen)
    x = torch.randn(64, k, generator=gen)
    many = L.linear(x, w)
    for size in (9, 12, 13, 31) + ((1, 2, 5, 6, 7, 8) if w.quads else ()):
        for r in range(0, 64 - size + 1, size):
            assert torch.equal(L.linear(x[r:r + size], w), many[r:r + size]), (size, r)
    if k % 64:
        LIB.digit_rows(0)
        try:
            assert torch.equal(L.linear(x, w), many)
        finally:
            LIB.digit_rows(9)


@pytest.mark.parametrize("group", [32, 64])
def test_the_integer_sums_of_int4_are_exact(every_call, group):
    """As for int8, with scale 1 and min 0 a group (codes 0-15 as vpdpbusd's signed operand);
    x's groups are 32 or 64 features, as the weight's."""
    gen = torch.Generator().manual_seed(8)
    m, n, k = 10, 40, 128
    x = torch.randint(-32767, 32768, (m, k), generator=gen)
    x[:, ::group] = 32767
    x[:, 1::group] = -32767
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    g = k // group
    w = L.pack_int4((codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), torch.ones(n, g), torch.zeros(n, g), group)
    assert torch.equal(L.linear(x.float(), w).double(), x.double() @ codes.double().T)


@pytest.mark.parametrize("fmt,group", [("int8", 64), ("int4", 16)])
def test_grouped_int8_and_int4_below_32_keep_the_float_path(every_call, fmt, group):
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(64, 256, generator=gen) * 0.05
    w = L.pack_int8(*quantize_int8(w, group)) if fmt == "int8" else L.pack_int4(*quantize_int4(w, group), group)
    assert not L.takes_digits(w)
    x = torch.randn(16, 256, generator=gen)
    y = L.linear(x, w)
    LIB.digit_rows(0)
    assert torch.equal(y, L.linear(x, w))
