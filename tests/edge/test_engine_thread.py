"""The engine thread in-process (tiny model, no Redis): a request that fails is reported
alone in ``failures`` while the others go on; a broken engine sets ``error`` and reports
every request it held in ``released``."""
import queue
import time

from gpu_worker.edge.engine_loop import EngineThread, Job
from gpu_worker.engine import EngineConfig, EngineCore
from gpu_worker.errors import EngineBrokenError
from gpu_worker.sampling_params import SamplingParams
from tests.engine.faults import poison_forward

BLOCK_BYTES = 16 * 2 * 2 * 2 * 16 * 4   # tokens * (k, v) * layers * kv heads * head dim * fp32
GREEDY = dict(temperature=0, ignore_eos=True, max_tokens=10)


def make_engine(model_dir, num_blocks=256):
    return EngineCore(EngineConfig(model=model_dir, kv_cache_memory=num_blocks * BLOCK_BYTES,
                                   max_num_batched_tokens=64))


def job(key, prompt_ids=None, prompt=None, **params):
    return Job(key=key, prompt=prompt, messages=None, prompt_token_ids=prompt_ids,
               params=SamplingParams(**{**GREEDY, **params}), priority=0, resume_token_ids=[],
               deadline=None)


class Outcome:
    """Everything the thread reported, by key."""

    def __init__(self):
        self.tokens, self.finished, self.failures, self.released = {}, {}, {}, []
        self.reports = []

    def add(self, report):
        self.reports.append(report)
        for d in report.deltas:
            self.tokens.setdefault(d.request_id, []).extend(d.new_token_ids)
            if d.finished:
                self.finished[d.request_id] = d.finish_reason
        for key, code, message in report.failures:
            assert key not in self.failures, "failed twice"
            self.failures[key] = code
        self.released += report.released

    def ended(self, key):
        return key in self.finished or key in self.failures or key in self.released


def serve(engine, jobs, on_report=None, timeout=60.0):
    """Run ``jobs`` through an EngineThread until each ended or the thread died."""
    reports, outcome = queue.Queue(), Outcome()
    thread = EngineThread(engine, on_output=reports.put)
    for j in jobs:
        thread.submit(j)
    thread.start()
    deadline = time.monotonic() + timeout
    while not all(outcome.ended(j.key) for j in jobs):
        assert time.monotonic() < deadline, (f"stuck: finished {outcome.finished}, failed "
                                             f"{outcome.failures}, released {outcome.released}")
        try:
            report = reports.get(timeout=0.5)
        except queue.Empty:
            assert thread.alive, "the thread died without a report"
            continue
        outcome.add(report)
        if on_report is not None:
            on_report(thread, report)
    thread.stop()
    return outcome, thread


JOBS = [job("t/a", [5, 6, 7, 8]), job("t/b", [900, 901]), job("t/bad", [40, 41, 42]), job("t/c", [7000] * 20)]


def test_huge_top_k_serves_the_whole_batch(tiny_model):
    # Before: the sampler's torch.tensor overflowed and the thread died without a report.
    jobs = JOBS[:2] + [job("t/bad", [40, 41, 42], top_k=2**63, temperature=1.0, seed=1)]
    out, thread = serve(make_engine(tiny_model), jobs)
    assert thread.error is None and not out.failures
    assert all(out.finished[j.key] == "length" and len(out.tokens[j.key]) == 10 for j in jobs)


def test_forward_failing_with_one_request_fails_it_alone(tiny_model):
    engine = make_engine(tiny_model)
    clean, _ = serve(engine, JOBS)
    poison_forward(engine, lambda ids: "t/bad" in ids)
    out, thread = serve(engine, JOBS)
    assert thread.error is None
    assert out.failures == {"t/bad": "internal"} and "t/bad" not in out.finished
    for key in ("t/a", "t/b", "t/c"):
        assert out.finished[key] == "length" and out.tokens[key] == clean.tokens[key]


def test_requests_failing_before_they_run_fail_alone(tiny_model):
    engine = make_engine(tiny_model)
    encode = engine.tokenizer.encode
    engine.tokenizer.encode = lambda text: encode(text) if text != "boom" else 1 / 0
    jobs = JOBS[:2] + [job("t/bad", prompt="boom"), job("t/neg", [5, 6], top_k=-1)]
    out, thread = serve(engine, jobs)
    assert thread.error is None
    assert out.failures == {"t/bad": "internal", "t/neg": "invalid_top_k"}
    assert out.finished == {"t/a": "length", "t/b": "length"}


def test_broken_engine_hands_back_every_request_it_held(tiny_model):
    # 12 blocks: two requests of 5 blocks run, the third waits in the local queue.
    engine = make_engine(tiny_model, num_blocks=12)
    poison_forward(engine, lambda ids: True)
    jobs = [job(f"t/{i}", [5 + i, 6, 7, 8], max_tokens=70) for i in range(3)]
    out, thread = serve(engine, jobs)
    assert isinstance(thread.error, EngineBrokenError)
    assert sorted(out.released) == sorted(j.key for j in jobs)   # none failed, none lost
    assert not out.failures and not out.finished
    thread.stop()
    assert not thread.alive


def test_cancelling_a_queued_request_while_others_run_reports_it(tiny_model):
    # 12 blocks: the first request takes 8, the second waits in the local queue.
    engine = make_engine(tiny_model, num_blocks=12)
    jobs = [job("t/long", [5, 6, 7, 8], max_tokens=120), job("t/queued", [9, 10, 11, 12], max_tokens=70)]

    def cancel_once_running(thread, report):
        if "t/long" in report.admitted:
            assert report.num_queued == 1
            thread.abort("t/queued", "cancelled")

    out, _ = serve(engine, jobs, on_report=cancel_once_running)
    assert out.finished == {"t/long": "length", "t/queued": "cancelled"}

