"""What the engine does when a model step raises: find whose fault it is.

A failed batch is run again in halves until each failure is pinned on one request, and
only those requests fail. Nothing was applied yet, so a retry computes the same tokens
into the same slots. When nothing in the batch could run at all, a probe (one token of a
throwaway request in a scratch block) tells a request that breaks the model apart from a
model that no longer runs anything: then the engine is broken and nobody is failed, so
the worker hands every request back for a healthy worker to resume.
"""
from __future__ import annotations

import logging

from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.errors import INTERNAL, EngineBrokenError
from gpu_worker.request import Request
from gpu_worker.runner import RunnerOutput
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import ScheduledRequest, SchedulerOutput

logger = logging.getLogger(__name__)

BROKEN_AFTER_FAILED_ALONE = 2  # different requests failing alone in a row: broken anyway
_PROBE_ID = "\x00probe"  # never a client's id (ids are checked against a safe alphabet)


def rerun_in_halves(engine, scheduled: list[ScheduledRequest], exc: Exception) -> RunnerOutput:
    """The merged output of every part of the failed step that runs; fails the requests
    that fail alone, or raises :class:`EngineBrokenError` (nobody failed)."""
    logger.warning("a step of %d requests failed (%r); retrying it in halves", len(scheduled), exc)
    merged, culprits, ran = RunnerOutput(), [], False
    failing = [(scheduled, exc)]
    while failing:
        group, error = failing.pop()
        if len(group) == 1:
            culprits.append((group[0].request, error))
            engine.num_failed_alone += 1
            continue
        half = len(group) // 2
        for part in (group[:half], group[half:]):
            try:
                merged.update(engine.runner.execute(
                    SchedulerOutput(part, sum(s.num_new_tokens for s in part))))
                ran, engine.num_failed_alone = True, 0
            except Exception as part_exc:  # noqa: BLE001 - narrowed down further
                failing.append((part, part_exc))
    if not ran:
        if engine.num_failed_alone >= BROKEN_AFTER_FAILED_ALONE:
            raise EngineBrokenError(f"{engine.num_failed_alone} requests in a row failed alone, "
                                    f"the last with {culprits[-1][1]!r}") from exc
        broken = probe(engine)
        if broken is not None:
            raise EngineBrokenError(f"the model fails even a one-token probe: {broken!r}") from exc
    for req, error in culprits:
        engine.scheduler.fail(req, INTERNAL, f"the model step failed on this request: {error!r}")
    return merged


def probe(engine) -> Exception | None:
    """Run one token through the model in a scratch block; the error, or None if it ran
    (also None when no block is free to probe with: the requests are blamed as before)."""
    kv = engine.kv
    block_ids = kv.allocate_slots(_PROBE_ID, 1)
    if block_ids is None:
        return None
    req = Request(request_id=_PROBE_ID, prompt_token_ids=[0],
                  params=SamplingParams(temperature=0.0, max_tokens=1),
                  detokenizer=IncrementalDetokenizer(engine.tokenizer, ()), eos_token_ids=(),
                  max_total_tokens=engine.max_model_len)
    try:
        engine.runner.execute(SchedulerOutput([ScheduledRequest(req, 1, 0, block_ids)], 1))
        return None
    except Exception as exc:  # noqa: BLE001 - exactly what is asked
        return exc
    finally:
        kv.free(_PROBE_ID)
