"""Apply a step's sampled tokens to the requests: stop checks, rollback of rejected drafts,
prefix-cache registration, and the deltas the caller sees.

What raises while one request is processed (its stop check, its detokenizer) fails that
request alone, through the scheduler; the other requests' deltas of the step still come.
"""
from __future__ import annotations

import logging

from gpu_worker.errors import INTERNAL
from gpu_worker.outputs import RequestDelta
from gpu_worker.request import Request
from gpu_worker.runner import RunnerOutput
from gpu_worker.scheduler import ScheduledRequest, Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)


def apply_step(sched: Scheduler, sched_out: SchedulerOutput, run_out: RunnerOutput) -> list[RequestDelta]:
    deltas: list[RequestDelta] = []
    for s in sched_out.scheduled:
        if s.request.is_finished:       # aborted, or failed while the step ran
            continue
        try:
            delta = _apply_one(sched, s, run_out)
        except Exception as exc:
            logger.exception("postprocessing %s failed", s.request.request_id)
            sched.fail(s.request, INTERNAL, f"postprocessing failed: {exc!r}")
            continue
        if delta is not None:
            deltas.append(delta)
    for req in sched.finished:          # aborted, timed out or failed since the last report
        deltas.append(_delta(req, [], final=True))
    sched.finished = []
    return deltas


def _apply_one(sched: Scheduler, s: ScheduledRequest, run_out: RunnerOutput) -> RequestDelta | None:
    req = s.request
    req.num_computed_tokens += s.num_new_tokens
    sampled = run_out.sampled.get(req.request_id)
    if s.num_spec_tokens:
        # Drafts beyond the accepted ones were computed into KV slots: roll them back.
        num_rejected = s.num_spec_tokens - (len(sampled) - 1 if sampled else 0)
        req.num_computed_tokens -= num_rejected
        sched.kv.trim(req.request_id, req.num_computed_tokens + 1)
    req.spec_token_ids = []
    if not sampled:                     # a prefill chunk that did not reach the end
        sched.kv.cache_computed(req.request_id, req.token_ids, req.num_computed_tokens)
        return None
    new_tokens = _append_until_stop(req, sampled)
    # After appending: accepted drafts are computed tokens that only now have ids.
    sched.kv.cache_computed(req.request_id, req.token_ids, min(req.num_computed_tokens, req.num_tokens))
    logprobs = run_out.logprobs.get(req.request_id)
    if logprobs is not None:
        logprobs = logprobs[:len(new_tokens)]
    if req.finish_reason is not None:
        sched.finish(req, req.finish_reason, req.stop_reason)
    return _delta(req, new_tokens, final=req.is_finished, logprobs=logprobs)


def _append_until_stop(req: Request, sampled: list[int]) -> list[int]:
    """Append tokens one by one; the first stop condition ends the request there."""
    p = req.params
    taken = []
    for tok in sampled:
        req.append_output(tok)
        taken.append(tok)
        may_stop = req.num_output_tokens >= p.min_tokens
        stop_string = req.detokenizer.push([tok], check_stop=may_stop)
        if may_stop:
            if tok in p.stop_token_ids:
                req.finish_reason, req.stop_reason = "stop", tok
            elif not p.ignore_eos and tok in req.eos_token_ids:
                req.finish_reason, req.stop_reason = "stop", None
            elif stop_string is not None:
                req.finish_reason, req.stop_reason = "stop", stop_string
        if req.finish_reason is None and req.num_output_tokens >= req.max_output_tokens:
            req.finish_reason = "length"
        if req.finish_reason is not None:
            break
    return taken


def _delta(req: Request, new_tokens: list[int], *, final: bool, logprobs=None) -> RequestDelta:
    failed = req.finish_reason == "error"   # its detokenizer may be what failed: no text
    return RequestDelta(
        request_id=req.request_id,
        new_token_ids=new_tokens,
        new_text="" if failed else req.detokenizer.take(final=final),
        finished=final,
        finish_reason=req.finish_reason if final else None,
        stop_reason=req.stop_reason if final else None,
        logprobs=logprobs,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=req.num_output_tokens,
        num_cached_tokens=max(req.num_cached_tokens, 0),
        error_code=req.error_code,
        error_message=req.error_message,
    )
