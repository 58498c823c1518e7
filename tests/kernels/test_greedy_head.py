"""The greedy head (kernels/cpu/greedy_head.py): its bf16 screen against a torch reference,
its bound, and its tokens against the full packed fp32 head's argmax, on data built to sit
at the edge of the bound (near ties, exact ties, loud input channels). The screen's pass runs
on AVX-512 (vdpbf16ps, or widened) or, where the CPU has AMX and K is a multiple of 32, on
the tiles, or over int8 codes for calls of few rows (AVX-512 or AVX2): the `path` fixture
runs each test on every path that runs here (`bf16_path` the tests of the bf16 pass alone)."""
import numpy as np
import pytest
import torch

from kernels.cpu import greedy_head, process_kernels
from kernels.cpu import linear as packed_linear
from kernels.cpu.greedy_head import GreedyHead, bound_factor, pack_pairs, reference_bf16_dot
from kernels.quantize import quantize_int8

pytestmark = pytest.mark.skipif(not greedy_head.available(), reason="the screen needs the C kernels' AVX2 or AVX-512 path")


_INT8_ROWS = [0]   # the heads that head() builds screen calls of up to this many rows over int8 codes


def _screen_path(param: str):
    """The screen's pass: bf16 on AVX-512, bf16 on the AMX tiles (skipped where the CPU has
    no AMX), or int8 codes (every call, whatever its rows)."""
    lib = process_kernels()
    if param != "int8" and lib.bf16dot is None:
        pytest.skip("the bf16 pass needs AVX-512")
    if param == "amx" and not (lib.bf16dot == "native" and lib.amx_rows > 0):
        pytest.skip("the AMX screen needs AMX-BF16")
    before = lib.bf16_dot_tuning()
    lib.bf16_dot_tuning(1 if param == "amx" else 0)
    _INT8_ROWS[0] = 10 ** 9 if param == "int8" else 0
    yield param
    lib.bf16_dot_tuning(before)
    _INT8_ROWS[0] = 0


@pytest.fixture(params=["avx512", "amx", "int8"])
def path(request):
    yield from _screen_path(request.param)


@pytest.fixture(params=["avx512", "amx"])
def bf16_path(request):
    """The bf16 pass alone (tests of GreedyHead.approx, which the int8 screen does not use)."""
    yield from _screen_path(request.param)


def head(w: torch.Tensor, **kw) -> GreedyHead:
    kw.setdefault("int8_rows", _INT8_ROWS[0])
    return GreedyHead(w, packed_linear.pack_f32(w), **kw)


def full_argmax(x: torch.Tensor, w: torch.Tensor) -> list[int]:
    return packed_linear.linear(x.contiguous(), packed_linear.pack_f32(w)).numpy().argmax(axis=1).tolist()


def loud_rows(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows with a few loud channels, as an LLM's last hidden state has."""
    x = torch.randn(m, k, generator=gen)
    x[:, : max(1, k // 64)] *= 30
    return x


@pytest.mark.parametrize("m,n,k", [(1, 1000, 64), (5, 77, 130), (33, 1000, 64), (64, 4099, 576), (70, 129, 96)])
def test_the_screen_is_bf16_x_times_bf16_w_summed_in_float32(m, n, k, bf16_path):
    gen = torch.Generator().manual_seed(m + n)
    x, w = loud_rows(m, k, gen), torch.randn(n, k, generator=gen) * 0.05
    got, want = head(w).approx(x), reference_bf16_dot(x, w)
    s = (x.bfloat16().double().abs() @ w.bfloat16().double().abs().T).float()   # sum |x_i w_ji|
    assert bool(((got - want).abs() <= 2 * k * 2.0 ** -24 * s + 1e-30).all())


def test_the_tiles_take_the_pass_where_k_is_a_multiple_of_32(bf16_path):
    assert greedy_head.on_amx(576) == (bf16_path == "amx")
    assert not greedy_head.on_amx(130)


def test_pairs_hold_two_consecutive_k_of_one_channel_a_lane():
    w = torch.arange(40 * 6, dtype=torch.float32).reshape(40, 6)
    p = pack_pairs(w)
    assert p.shape == (2, 3, 32, 2) and p.dtype == torch.bfloat16
    assert p[1, 2, 3].tolist() == [w[35, 4].item(), w[35, 5].item()] and not p[1, :, 8:].any()
    with pytest.raises(ValueError, match="even K"):
        pack_pairs(torch.ones(4, 5))


def test_the_bound_holds_where_both_operands_round_the_most(bf16_path):
    # Every value halfway between two bf16 neighbours rounds by the most bf16 rounds anything;
    # all of one sign, so no rounding error cancels another.
    k = 576
    x = torch.full((3, k), 1 + 2.0 ** -8 + 2.0 ** -20)
    w = torch.full((5, k), 1 + 2.0 ** -8 + 2.0 ** -20) * torch.arange(1, 6)[:, None]
    g = head(w)
    err = (g.approx(x).double() - x.double() @ w.double().T).abs()
    bound = bound_factor(k) * x.double().norm(dim=1)[:, None] * w.double().norm(dim=1)[None, :]
    assert bool((err <= bound).all()) and float((err / bound).max()) > 0.5   # tight, not loose by orders


@pytest.mark.parametrize("m", [1, 3, 8, 13, 64, 100])
def test_tokens_are_the_full_heads_argmax_on_near_ties(m, path):
    gen = torch.Generator().manual_seed(m)
    k, n = 256, 3000
    w = torch.randn(n, k, generator=gen) * 0.05
    # 300 channels within a hair of channel 7: the screen cannot tell them apart, the exact
    # recompute must; a bound too small by any margin would drop the true winner.
    w[1000:1300] = w[7] + torch.randn(300, k, generator=gen) * 1e-4
    x = loud_rows(m, k, gen)
    x[: m // 2] = w[7] * 40 + torch.randn(m // 2, k, generator=gen) * 0.01
    g = head(w, cap=512, max_union=0.5)   # 3,000 channels: the near ties alone are a tenth
    want = full_argmax(x, w)
    assert g.argmax(x) == want
    if m >= 8 and g.bf16:   # the screen alone would have picked wrong: the recompute decided
        assert g.approx(x).numpy().argmax(axis=1).tolist()[: m // 2] != want[: m // 2]


def test_exact_ties_go_to_the_first_index_as_torch_argmax_does(path):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(500, 64, generator=gen)
    w[400] = w[90]
    w[450] = w[90]
    x = (w[90] * 5).repeat(4, 1)
    assert head(w).argmax(x) == [90] * 4 == full_argmax(x, w)


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("m", [1, 4, 9, 49, 64, 101])
def test_candidate_columns_carry_the_full_heads_bits(m, pairs):
    # The recompute over the union of candidates runs the same packed kernel on the same rows:
    # every column's sum must not depend on which columns the call holds (or on the tuning).
    gen = torch.Generator().manual_seed(100 + m)
    w, x = torch.randn(2000, 576, generator=gen) * 0.05, loud_rows(m, 576, gen)
    before = packed_linear.tuning(f32_pairs=pairs)
    try:
        full = packed_linear.linear(x, packed_linear.pack_f32(w))
        cols = torch.tensor(sorted({3, 31, 32, 77, 640, 641, 1999} | set(range(1200, 1264))))
        sub = packed_linear.linear(x, packed_linear.pack_f32(w[cols]))
    finally:
        packed_linear.tuning(**before)
    assert torch.equal(sub, full[:, cols])


def test_real_model_rows_agree_with_the_full_head(path):
    from gpu_worker.model.default_model import default_model_dir
    from gpu_worker.model.loader import load_state_dict

    w = load_state_dict(default_model_dir())["model.embed_tokens.weight"].float().contiguous()
    gen = torch.Generator().manual_seed(0)
    # Hidden states like the model's last ones: a few loud channels, norms of 35-65.
    x = loud_rows(64, w.shape[1], gen)
    x = x / x.norm(dim=1, keepdim=True) * torch.linspace(35, 65, 64)[:, None]
    g = head(w)
    assert g.argmax(x) == full_argmax(x, w)


def test_it_declines_what_it_cannot_decide(path):
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(300, 64, generator=gen)
    g = head(w, cap=16)
    x = torch.randn(2, 64, generator=gen)
    assert g.argmax(x[:0]) == []
    assert g.argmax(torch.cat([x, torch.full((1, 64), float("nan"))])) is None
    assert g.argmax(torch.cat([x, torch.zeros(1, 64)])) is None            # |x| = 0: every token ties
    same = head(torch.ones(300, 64), cap=16)                                # 300 candidates > cap
    assert same.argmax(x.abs()) is None
    assert head(torch.ones(300, 64), cap=512, max_union=0.5).argmax(x.abs()) is None   # a union of all
    with pytest.raises(ValueError, match="f32-packed"):
        GreedyHead(w, packed_linear.pack_bf16(w))


def test_scratch_grows_and_is_reused(path):
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(100, 32, generator=gen)
    g = head(w, max_union=1.0)
    for m in (3, 1, 40, 7):
        x = torch.randn(m, 32, generator=gen)
        assert g.argmax(x) == full_argmax(x, w)
    assert g._rows == 40
    assert isinstance(np.asarray(g.candidates(x)[0]), np.ndarray)


@pytest.mark.parametrize("m,n,k", [(1, 1000, 64), (3, 77, 130), (8, 4099, 576), (32, 517, 576)])
def test_the_int8_screens_bound_holds(m, n, k):
    # Loud input channels, channels of very different ranges, one all zero: the int8 screen's
    # approximation against the exact product, within |x| times each channel's bound.
    gen = torch.Generator().manual_seed(7 * m + n)
    x = loud_rows(m, k, gen)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 0, n)[:, None]
    w[n // 2] = 0
    w[1, 0] = 40.0   # one outlier: a coarse scale for that channel
    g = head(w, int8_rows=m)
    got = g.int8_approx(x).double()   # the kernel the screen calls
    exact = x.double() @ w.double().T
    bound = x.double().norm(dim=1)[:, None] * g.wbound8.double()[None, :]
    assert bool(((got - exact).abs() <= bound).all())
    assert float(((got - exact).abs() / bound).max()) > 1e-3   # not loose by orders of magnitude


def test_the_int8_screen_takes_small_calls_and_the_bf16_pass_the_rest(monkeypatch):
    # Without the bf16 pass (no AVX-512) the calls past int8_rows are declined instead: the
    # caller computes the whole head for them.
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(3000, 256, generator=gen) * 0.05
    g = head(w, int8_rows=4)
    calls, real = [], g.int8_approx
    monkeypatch.setattr(g, "int8_approx", lambda x, *a: calls.append((x.shape[0], "int8")) or real(x, *a))
    for m in (1, 4, 5, 9):
        x = loud_rows(m, 256, gen)
        assert g.argmax(x) == (full_argmax(x, w) if g.bf16 or m <= 4 else None)
    assert [m for m, fmt in calls if fmt == "int8"] == [1, 4]
    assert g.max_rows == (None if g.bf16 else 4)


def test_without_the_bf16_pass_it_needs_the_int8_screen(monkeypatch):
    monkeypatch.setattr(greedy_head, "mode", lambda: None)   # a CPU without AVX-512
    w = torch.randn(100, 32, generator=torch.Generator().manual_seed(12))
    with pytest.raises(RuntimeError, match="int8_rows"):
        head(w, int8_rows=0)
    g = head(w, int8_rows=3, max_rows=12)
    assert (g.bf16, g.pairs, g.max_rows) == (False, None, 3)
    x = loud_rows(3, 32, torch.Generator().manual_seed(13))
    assert g.argmax(x) == full_argmax(x, w) and g.argmax(torch.cat([x, x])) is None
    assert g.candidates(torch.cat([x, x])) is None
    with pytest.raises(RuntimeError, match="AVX-512"):
        g.approx(x)


@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_codes_laid_out_at_load_give_the_two_byte_paths_bits(m):
    # Where the two-byte path runs (AVX512_VNNI, no AMX), the screen's codes are laid out once
    # and give the bits that path gives laying each tile out per call.
    lib = process_kernels()
    gen = torch.Generator().manual_seed(20 + m)
    w = torch.randn(1000, 128, generator=gen) * torch.logspace(-2, 0, 1000)[:, None]
    g = head(w, int8_rows=16)
    if g.laid is None:
        pytest.skip("the two-byte int8 path does not run on this CPU")
    x = loud_rows(m, 128, gen)
    codes, scale = quantize_int8(w)
    before = lib.digit_rows()
    try:
        lib.digit_rows(1)   # every per-channel int8 call through the two-byte path
        want = packed_linear.linear(x, packed_linear.pack_int8(codes, scale))
    finally:
        lib.digit_rows(before)
    assert torch.equal(g.int8_approx(x), want)
    assert g.codes.data.numel() == 0   # the tiles' own codes are not kept beside the laid ones
