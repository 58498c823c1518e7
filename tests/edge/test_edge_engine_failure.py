"""A worker whose engine breaks for good hands every request back with its progress, so
another worker resumes it at once instead of after the claim timeout."""
from __future__ import annotations

import os
import time

from redis_server import REPO

from producer import FleetClient
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
LONG = dict(prompt_token_ids=PROMPT, temperature=0.0, ignore_eos=True)

# Loaded by the worker's interpreter at start-up (test-only fault injection): after
# FAULT_AFTER model steps, every forward raises, as a dead GPU or a corrupted cache would.
SITECUSTOMIZE = """
import os
from gpu_worker import runner

_after = int(os.environ["FAULT_AFTER"])
_real = runner.ModelRunner.execute
_calls = [0]

def execute(self, sched):
    _calls[0] += 1
    if _calls[0] > _after:
        raise RuntimeError("injected: the device is gone")
    return _real(self, sched)

runner.ModelRunner.execute = execute
"""


def test_a_broken_engine_hands_back_everything_before_it_exits(workers, redis_server, r, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    fault_env = {"FAULT_AFTER": "40",
                 "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    claim_idle_ms = 120_000  # far longer than the test may take: only a hand-back is fast enough
    broken = workers.start(env=fault_env, claim_idle_ms=claim_idle_ms)
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(request_id="victim", max_tokens=300, **LONG)
        first = next(iter(stream))
        assert broken.wait(timeout=60) == 1  # the engine broke: the worker exits non-zero
        assert "handed back" in broken.output()
        t0 = time.monotonic()
        workers.start(claim_idle_ms=claim_idle_ms)
        tokens = [first] + list(stream)
        result = stream.result(timeout=60)
    assert time.monotonic() - t0 < 60
    assert result.num_resumes == 1 and len(result.token_ids) == 300
    assert [i for t in tokens for i in t.token_ids] == result.token_ids  # each token once
    assert r.xpending(keys.stream_key("default", "default", "default"), keys.GROUP)["pending"] == 0 \
        or time.sleep(1) or r.xpending(keys.stream_key("default", "default", "default"), keys.GROUP)["pending"] == 0
