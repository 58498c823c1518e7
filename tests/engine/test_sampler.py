"""Each sampling parameter changes the output as specified; a seed reproduces it."""
import math
from collections import Counter

import pytest
import torch

from gpu_worker.sampler import Sampler, SamplingRow
from gpu_worker.sampling_params import SamplingParams

V = 10
PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.02, 0.01, 0.01, 0.005, 0.005])


def row(position=0, prompt=(), outputs=(), eos=(9,), **params):
    return SamplingRow(SamplingParams(**params), position, list(prompt), list(outputs), eos)


def draw(n=2000, **params):
    s = Sampler(seed=0)
    rows = [row(position=i, **params) for i in range(n)]
    tokens, _ = s.sample(PROBS.log().repeat(n, 1), rows)
    return Counter(tokens)


def test_greedy_is_argmax():
    logits = torch.randn(4, V)
    tokens, _ = Sampler().sample(logits.clone(), [row(temperature=0)] * 4)
    assert tokens == logits.argmax(-1).tolist()


def test_temperature_one_matches_the_distribution():
    counts = draw(temperature=1.0)
    for t in range(4):
        assert abs(counts[t] / 2000 - float(PROBS[t])) < 0.04


def test_low_temperature_sharpens_high_flattens():
    assert draw(temperature=0.2)[0] > draw(temperature=1.0)[0] > draw(temperature=3.0)[0]


def test_top_k_keeps_only_k_tokens():
    assert set(draw(temperature=1.0, top_k=3)) == {0, 1, 2}
    assert set(draw(temperature=1.0, top_k=1)) == {0}


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert set(draw(temperature=1.0, top_p=0.6)) == {0, 1}     # 0.4 < 0.6 <= 0.65
    assert set(draw(temperature=1.0, top_p=0.3)) == {0}


def test_min_p_drops_tokens_below_fraction_of_max():
    assert set(draw(temperature=1.0, min_p=0.3)) == {0, 1, 2}   # >= 0.12


def test_repetition_penalty_discourages_prompt_tokens():
    logits = PROBS.log()[None].clone()
    base, _ = Sampler().sample(logits.clone(), [row(temperature=0)])
    pen, _ = Sampler().sample(logits.clone(), [row(temperature=0, prompt=[0], repetition_penalty=3.0)])
    assert base == [0] and pen == [1]


def test_frequency_and_presence_penalties_use_output_counts():
    logits = torch.tensor([[2.0, 1.9] + [0.0] * (V - 2)])
    freq, _ = Sampler().sample(logits.clone(), [row(temperature=0, outputs=[0], frequency_penalty=0.5)])
    pres, _ = Sampler().sample(logits.clone(), [row(temperature=0, outputs=[0, 0], presence_penalty=0.2)])
    none, _ = Sampler().sample(logits.clone(), [row(temperature=0, outputs=[0, 0])])
    assert freq == [1] and pres == [1] and none == [0]


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.full((1, V), -5.0)
    logits[0, 9], logits[0, 3] = 5.0, 4.0
    early, _ = Sampler().sample(logits.clone(), [row(temperature=0, min_tokens=2, outputs=[1])])
    stop, _ = Sampler().sample(logits.clone(), [row(temperature=0, min_tokens=2, stop_token_ids=[3], outputs=[1])])
    late, _ = Sampler().sample(logits.clone(), [row(temperature=0, min_tokens=2, outputs=[1, 1])])
    assert early == [3] and stop not in ([9], [3]) and late == [9]


def test_seed_reproduces_whatever_the_batch():
    logits = torch.randn(1, V)
    alone, _ = Sampler(seed=1).sample(logits.clone(), [row(position=7, temperature=1.0, seed=42)])
    crowd_logits = torch.cat([torch.randn(3, V), logits])
    rows = [row(position=i, temperature=1.0) for i in range(3)] + [row(position=7, temperature=1.0, seed=42)]
    crowded, _ = Sampler(seed=2).sample(crowd_logits, rows)
    assert crowded[3] == alone[0]
    many = {Sampler().sample(logits.clone(), [row(position=p, temperature=1.0, seed=42)])[0][0] for p in range(40)}
    assert len(many) > 1        # positions draw differently


def test_logprobs_of_sampled_and_top_n():
    logits = torch.randn(2, V)
    tokens, lps = Sampler().sample(logits.clone(), [row(temperature=0, logprobs=3), row(temperature=0, logprobs=0)])
    ref = logits.log_softmax(-1)
    assert lps[0].logprob == pytest.approx(float(ref[0, tokens[0]]), abs=1e-5)
    assert [t for t, _ in lps[0].top] == ref[0].topk(3).indices.tolist()
    assert lps[1].top == () and math.isfinite(lps[1].logprob)
