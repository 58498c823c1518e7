"""What the engine does when a model step raises: find whose fault it is.

A failed batch is run again in halves until each failure is pinned on one request, and
only those fail (nothing was applied yet, so a retry computes the same tokens into the same
slots). When nothing could run at all, a one-token probe of a throwaway request in a scratch
block tells a request that breaks the model from a model that runs nothing: then the engine
is broken and nobody fails, so the worker hands every request back for another to resume.
"""
from __future__ import annotations

import logging

from gpu_worker.errors import INTERNAL, EngineBrokenError
from gpu_worker.request import RequestFactory
from gpu_worker.runner import ModelRunner, RunnerOutput
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import ScheduledRequest, Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)

BROKEN_AFTER_FAILED_ALONE = 2  # different requests failing alone in a row: broken anyway
_PROBE_ID = "\x00probe"  # never a client's id (ids are checked against a safe alphabet)


class GuardedRunner:
    """Runs steps through ``runner``; a step that raises is narrowed down as above."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, factory: RequestFactory) -> None:
        self.runner, self.scheduler, self.factory = runner, scheduler, factory
        self.num_failed_alone = 0  # consecutive requests failed alone, no step ran since

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        """The step's output. Fails (through the scheduler) the requests that fail alone, or
        raises :class:`EngineBrokenError` (nobody failed) when the model runs nothing."""
        try:
            out = self.runner.execute(sched_out)
        except Exception as exc:  # the batch failed as a whole: find out whose fault it is
            return self._rerun_in_halves(sched_out.scheduled, exc)
        self.num_failed_alone = 0
        return out

    def _rerun_in_halves(self, scheduled: list[ScheduledRequest], exc: Exception) -> RunnerOutput:
        logger.warning("a step of %d requests failed (%r); retrying it in halves", len(scheduled), exc)
        merged, culprits, ran = RunnerOutput(), [], False
        failing = [(scheduled, exc)]
        while failing:
            group, error = failing.pop()
            if len(group) == 1:
                culprits.append((group[0].request, error))
                self.num_failed_alone += 1
                continue
            half = len(group) // 2
            for part in (group[:half], group[half:]):
                try:
                    merged.update(self.runner.execute(SchedulerOutput(part, sum(s.num_new_tokens for s in part))))
                    ran, self.num_failed_alone = True, 0
                except Exception as part_exc:  # noqa: BLE001 - narrowed down further
                    failing.append((part, part_exc))
        if not ran:
            if self.num_failed_alone >= BROKEN_AFTER_FAILED_ALONE:
                raise EngineBrokenError(f"{self.num_failed_alone} requests in a row failed alone, "
                                        f"the last with {culprits[-1][1]!r}") from exc
            broken = self.probe()
            if broken is not None:
                raise EngineBrokenError(f"the model fails even a one-token probe: {broken!r}") from exc
        for req, error in culprits:
            self.scheduler.fail(req, INTERNAL, f"the model step failed on this request: {error!r}")
        return merged

    def probe(self) -> Exception | None:
        """Run one token through the model in a scratch block; the error, or None if it ran
        (also None when no block is free to probe with: the requests are blamed as before)."""
        req = self.factory.make(_PROBE_ID, [0], SamplingParams(temperature=0.0, max_tokens=1))
        with self.scheduler.scratch_step(req) as step:
            if step is None:
                return None
            try:
                self.runner.execute(step)
                return None
            except Exception as exc:  # noqa: BLE001 - exactly what is asked
                return exc
