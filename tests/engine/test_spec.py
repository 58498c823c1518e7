"""Speculative decoding: greedy outputs unchanged by any proposer; sampling stays exact."""
import random
from collections import Counter

import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.rejection_sampler import verify_drafts
from gpu_worker.runner import RunnerOutput
from gpu_worker.sampler import Sampler, SamplingRow


class WrongProposer:
    """Always drafts tokens the model will not choose."""

    name, uses_model, observe = "wrong", False, None

    def propose(self, items):
        return {it.request.request_id: [(it.request.token_ids[-1] + 7 + i) % 1000 for i in range(it.k)]
                for it in items}


class GuessProposer:
    """Drafts a fixed guess of the next tokens."""

    name, uses_model, observe = "guess", False, None

    def __init__(self, guess):
        self.guess = guess

    def propose(self, items):
        return {it.request.request_id: self.guess[:it.k] for it in items}


def workload(seed=0, n=10):
    rng = random.Random(seed)
    base = [rng.randrange(100, 48000) for _ in range(40)]
    ps = []
    for i in range(n):
        motif = [rng.randrange(100, 48000) for _ in range(rng.randrange(3, 9))]
        ps.append((base if i % 3 == 0 else []) + motif * rng.randrange(2, 6))   # repeats: n-gram material
    return ps


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("draft"), "llama", seed=5, num_layers=1)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20)
    ps = workload()
    outs = llm.generate(ps, [SamplingParams(temperature=0, max_tokens=12 + i, ignore_eos=True) for i in range(len(ps))])
    return ps, [o.token_ids for o in outs]


@pytest.mark.parametrize("kind", ["ngram", "self", "self-int8", "self-int4", "draft", "wrong"])
def test_greedy_identical_with_speculation(kind, tiny_llama_dir, draft_dir, reference):
    ps, want = reference
    # Small KV budget (preemption) and a small token budget (chunked prefill), prefix caching on.
    spec = {"wrong": "ngram", "self-int8": "self", "self-int4": "self"}.get(kind, kind)
    opts = dict(kv_cache_memory=24 * 16 * 256, max_num_batched_tokens=64, speculative=spec,
                num_speculative_tokens=3, spec_adaptive=False, draft_model=draft_dir, self_draft_layers=1,
                self_draft_quantization=kind[len("self-"):] if kind in ("self-int8", "self-int4") else None)
    llm = LLM(tiny_llama_dir, **opts)
    if kind == "wrong":
        llm.engine.speculator.proposer = WrongProposer()
    outs = llm.generate(ps, [SamplingParams(temperature=0, max_tokens=12 + i, ignore_eos=True) for i in range(len(ps))])
    assert [o.token_ids for o in outs] == want
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0
    assert sum(stats["spec_drafted_tokens"].values()) > 0
    if kind == "wrong":
        assert sum(stats["spec_accepted_tokens"].values()) == 0
    if kind == "self-int8":     # the target's own weights at int8 agree with it most of the time
        assert stats["spec_acceptance_rate"] > 0.5
    if kind == "self-int4":     # int4 with activation-aware scales from the calibration text
        from gpu_worker.model.ops.cpu_linear import CpuPackedLinear
        from gpu_worker.model.quant.quantize import Int4Linear

        qkv = llm.engine.speculator.proposer.model.layers[0].qkv   # packed for the C kernels on the CPU
        assert isinstance(qkv, Int4Linear) or (isinstance(qkv, CpuPackedLinear) and qkv.fmt == "int4")
        assert qkv.input_scale is not None
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks


def test_ngram_accepts_on_repetitive_text(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20, speculative="ngram", spec_adaptive=False)
    llm.generate(workload(1), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert llm.engine.stats()["spec_acceptance_rate"] > 0.2


def test_opt_out_per_request(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20, speculative="ngram", spec_adaptive=False)
    llm.generate(workload(2, 4), SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, speculative=False))
    assert llm.engine.stats()["spec_drafted_tokens"]["ngram"] == 0


def chi_square_p(observed: Counter, expected: dict, n: int) -> float:
    keys = [k for k, p in expected.items() if p * n >= 5]
    stat = sum((observed.get(k, 0) - expected[k] * n) ** 2 / (expected[k] * n) for k in keys)
    rest_p = 1 - sum(expected[k] for k in keys)
    rest_o = n - sum(observed.get(k, 0) for k in keys)
    if rest_p * n >= 5:
        stat += (rest_o - rest_p * n) ** 2 / (rest_p * n)
        keys.append(None)
    df = len(keys) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_rejection_sampler_output_is_distributed_as_the_target(top_p):
    """With a fixed draft, the first emitted token must follow p (after top-p) exactly."""
    torch.manual_seed(0)
    vocab, n = 8, 20000
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    rows = [SamplingRow(params, 10, [], [], ()), SamplingRow(params, 11, [], [1], ())]

    class Req:
        request_id, spec_token_ids = "r", [1]

    class Sched:
        request = Req()

    firsts = Counter()
    for _ in range(n):
        out = RunnerOutput()
        verify_drafts(sampler, torch.stack([logits, logits]).clone(), rows, [(Sched(), 0, 2)], out)
        firsts[out.sampled["r"][0]] += 1
    probs = logits.softmax(-1)
    if top_p < 1:
        keep = (probs.cumsum(-1) - probs) < top_p
        probs = torch.where(keep, probs, 0.0)
        probs /= probs.sum()
    expected = {i: float(probs[i]) for i in range(vocab)}
    assert chi_square_p(firsts, expected, n) > 0.001
    assert all(firsts[i] == 0 for i in range(vocab) if expected[i] == 0)


@pytest.fixture(scope="module")
def peaked_dir(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("peaked"), "llama", seed=2, num_layers=1, init_std=1.0)


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_engine_sampling_distribution_unchanged_by_speculation(peaked_dir, top_p):
    """Distribution of the 2nd and 3rd generated tokens, with and without (n-gram) drafts."""
    prompt = [500, 600, 700, 500, 600, 700, 500, 600]
    n = 600

    def histogram(guess=None):
        opts = dict(speculative="ngram", spec_adaptive=False, num_speculative_tokens=2) if guess else {}
        llm = LLM(peaked_dir, kv_cache_memory=64 << 20, max_num_seqs=256, seed=3 if guess else 4, **opts)
        if guess:
            llm.engine.speculator.proposer = GuessProposer(guess)
        outs = llm.generate([prompt] * n, SamplingParams(temperature=1.0, top_p=top_p, max_tokens=3, ignore_eos=True))
        return Counter(tuple(o.token_ids[1:3]) for o in outs), llm

    base, _ = histogram()
    assert base.most_common(1)[0][1] > n // 20      # peaked enough for drafts to be accepted
    # Draft the likeliest continuation, so that drafts are accepted often and rejected often.
    with_spec, llm = histogram(guess=list(base.most_common(1)[0][0]))
    stats = llm.engine.stats()
    assert 0 < stats["spec_accepted_tokens"]["ngram"] < stats["spec_drafted_tokens"]["ngram"]
    # Two-sample chi-square over the outcomes seen often enough.
    keys = [k for k in set(base) | set(with_spec) if base[k] + with_spec[k] >= 10]
    stat = sum((base[k] - with_spec[k]) ** 2 / (base[k] + with_spec[k]) for k in keys)
    p = float(torch.special.gammaincc(torch.tensor((len(keys) - 1) / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    assert p > 0.001, (p, base.most_common(5), with_spec.most_common(5))
