"""Adaptive speculation depth: two step-cost lines (steps that verify drafts, plain ones), and
a step's drafts dropped where they would cost its rows more than they add."""
from types import SimpleNamespace

from gpu_worker.spec.adaptive import PLAIN_EVERY, PLAIN_EVERY_MEASURED, AdaptiveDepth
from gpu_worker.spec.speculator import Speculator


def _measured(depth: AdaptiveDepth, plain=(0.010, 0.001), spec=(0.020, 0.001)) -> None:
    for n in (1, 2, 4, 8, 16, 32, 48, 64):
        depth.observe(n, plain[0] + plain[1] * n, drafted=False)
        depth.observe(n, spec[0] + spec[1] * n, drafted=True)


def test_each_kind_of_step_has_its_own_line():
    depth = AdaptiveDepth(4)
    _measured(depth)
    (ap, bp), (as_, bs) = depth.cost.coefficients(), depth.spec_cost.coefficients()
    assert abs(ap - 0.010) < 1e-9 and abs(bp - 0.001) < 1e-9
    assert abs(as_ - 0.020) < 1e-9 and abs(bs - 0.001) < 1e-9


def test_drafts_of_one_request_do_not_pay_for_a_large_batch_but_do_for_one_row():
    depth = AdaptiveDepth(4)
    assert depth.worth_it(32, {"a": 4})          # nothing measured yet: draft, and learn
    _measured(depth)
    depth.global_alpha = 0.9
    assert not depth.worth_it(32, {"a": 4})      # 35.1 tokens in 56 ms against 32 in 42
    assert depth.worth_it(1, {"a": 4})           # 4.1 tokens in 25 ms against 1 in 11
    every = {str(i): 4 for i in range(32)}
    assert not depth.worth_it(32, every)         # compute-bound: 131 tokens in 180 ms against 32 in 42
    cheap = AdaptiveDepth(4)
    _measured(cheap, spec=(0.020, 0.0002))       # a verified row costs a fifth of a plain one
    cheap.global_alpha = 0.9
    assert cheap.worth_it(32, every)             # 131 tokens in 52 ms


class _Always:
    name, uses_model, observe = "always", False, None

    def propose(self, items):
        return {it.request.request_id: [1] * it.k for it in items}


def _decoding(n):
    return [(SimpleNamespace(request_id=str(i), params=SimpleNamespace(speculative=True), max_num_drafts=4,
                             grammar=None), []) for i in range(n)]


def test_the_speculator_leaves_a_few_steps_without_drafts():
    spec = Speculator(_Always(), 4)
    got = [bool(spec.propose(_decoding(2))[0]) for _ in range(2 * PLAIN_EVERY)]
    assert got.count(False) == 2 and not got[PLAIN_EVERY - 1] and not got[-1]
    _measured(spec.depth, spec=(0.010, 0.0001))   # both lines measured, drafting pays: fewer probes
    got = [bool(spec.propose(_decoding(2))[0]) for _ in range(PLAIN_EVERY_MEASURED)]
    assert got.count(False) == 1
    fixed = Speculator(_Always(), 4, adaptive=False)
    assert all(fixed.propose(_decoding(2))[0] for _ in range(2 * PLAIN_EVERY))


def test_the_speculator_drops_drafts_that_cost_the_step_more():
    spec = Speculator(_Always(), 4)
    _measured(spec.depth, spec=(0.200, 0.001))    # a drafted step costs 190 ms more: never worth it
    assert spec.propose(_decoding(4)) == ({}, [])
    # ... but one step in PLAIN_EVERY_MEASURED drafts anyway, so that the drafted line is
    # measured again should the load change (it would otherwise stay frozen)
    got = [bool(spec.propose(_decoding(4))[0]) for _ in range(PLAIN_EVERY_MEASURED)]
    assert got.count(True) == 1


class _Counting(_Always):
    uses_model = True

    def __init__(self):
        self.calls = 0

    def propose(self, items):
        self.calls += 1
        return super().propose(items)


def test_a_model_drafter_is_not_run_for_drafts_the_step_would_drop():
    drafter = _Counting()
    spec = Speculator(drafter, 4)
    _measured(spec.depth, spec=(0.010, 0.0001))
    spec.depth.draft_seconds_per_token = 0.050       # drafting itself costs more than it saves
    assert spec.propose(_decoding(4)) == ({}, []) and drafter.calls == 0
    spec.depth.draft_seconds_per_token = 0.0001
    assert spec.propose(_decoding(4))[0] and drafter.calls == 1
