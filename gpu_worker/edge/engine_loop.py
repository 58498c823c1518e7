"""The engine thread: the only caller of :class:`EngineCore`.

The asyncio side hands it work through a thread-safe inbox (:meth:`EngineThread.submit`,
:meth:`abort`, :meth:`release_queued`); it drains the inbox before every step, keeps the
small local queue of requests read from Redis but not yet admitted by free KV blocks, and
reports every step's deltas plus a snapshot of its load through ``on_output``.

A request that fails alone (its tokenization, its validation, its own part of a step) is
reported in ``failures`` and the thread goes on. When the engine itself is broken, the
thread sets :attr:`EngineThread.error`, reports every request it holds in ``released``
(for a hand-back with their stored progress) and stops.
"""
from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.errors import INTERNAL, InvalidRequestError
from gpu_worker.fork import ParallelSampling
from gpu_worker.outputs import RequestDelta
from gpu_worker.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05


@dataclass(frozen=True, kw_only=True)
class Job:
    """One request for the engine. ``key`` is the engine's request id (tenant/request id).
    ``n > 1``: ``resume_choices[i]`` are choice i's tokens already delivered (choice 0's are
    ``resume_token_ids``), choices in ``skip`` ended already."""

    key: str
    prompt: str | None
    messages: list[dict] | None
    prompt_token_ids: list[int] | None
    params: SamplingParams
    priority: int
    resume_token_ids: list[int]
    deadline: float | None
    n: int = 1
    resume_choices: list[list[int]] = field(default_factory=list)
    skip: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class StepReport:
    """What one pass of the engine thread produced, for the IO side.

    ``failures``: requests this thread failed, each once, never also in ``deltas``.
    ``released``: requests given back unfinished: the local queue on ``release_queued``;
    everything held (queued, running, finished but unreported) in the last report of a
    thread whose ``error`` is set.
    """

    deltas: list[RequestDelta] = field(default_factory=list)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # key, code, message
    admitted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    num_queued: int = 0  # the local queue: read from Redis, not yet admitted
    step_time: float = 0.0


@dataclass
class _Queued:
    job: Job
    prompt_ids: list[int]


class EngineThread:
    """Runs ``engine.step()`` in one dedicated thread; everything else talks to it by messages."""

    def __init__(self, engine, *, on_output: Callable[[StepReport], None]) -> None:
        self.engine = engine
        self.sampling = ParallelSampling(engine)  # n > 1; requests with n == 1 pass through
        self._on_output = on_output
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._queued: list[_Queued] = []  # ordered by (priority, arrival)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.error: BaseException | None = None

    # -- called from any thread ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        self._inbox.put(("add", job))

    def abort(self, key: str, reason: str) -> None:
        self._inbox.put(("abort", (key, reason)))

    def release_queued(self) -> None:
        """Give up every request not yet admitted (draining); reported as ``released``."""
        self._inbox.put(("release", None))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        report = StepReport()
        try:
            while not self._stop.is_set():
                report = StepReport()
                self._one_pass(report)
        except BaseException as exc:  # the engine is broken: the worker must hand back and stop
            logger.exception("engine thread failed; handing back every request it holds")
            self.error = exc
            report.released.extend(self._held_keys())
            self._on_output(report)

    def _one_pass(self, report: StepReport) -> None:
        busy = self.sampling.has_unfinished_requests() or bool(self._queued)
        self._drain_inbox(report, block=not busy)
        self._admit(report)
        if self.sampling.has_unfinished_requests():
            t0 = time.perf_counter()
            deltas = self.sampling.step()
            report.step_time = time.perf_counter() - t0
            for d in deltas:
                if d.finish_reason == "error":
                    report.failures.append((d.request_id, d.error_code or INTERNAL,
                                            d.error_message or "the engine failed on this request"))
                    self.sampling.abort_request(d.request_id, "failed")  # its other choices
                else:
                    report.deltas.append(d)
        report.stats = self.engine.stats()
        report.num_queued = len(self._queued)
        if report.deltas or report.failures or report.admitted or report.released or busy:
            self._on_output(report)

    def _held_keys(self) -> list[str]:
        """Every request handed to this thread and not yet reported finished."""
        held = [q.job.key for q in self._queued]
        self._queued.clear()
        held += [job.key for kind, job in self._messages(block=False) if kind == "add"]
        return held + self.sampling.unfinished_request_ids()

    def _messages(self, *, block: bool) -> Iterator[tuple[str, Any]]:
        """The inbox's messages until it is empty; with ``block``, waiting a little for the first."""
        try:
            yield self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                yield self._inbox.get_nowait()
        except queue.Empty:
            return

    def _drain_inbox(self, report: StepReport, *, block: bool) -> None:
        for kind, payload in self._messages(block=block):
            if kind == "add":
                self._enqueue(payload, report)
            elif kind == "abort":
                self._abort(*payload, report)
            elif kind == "release":
                report.released.extend(q.job.key for q in self._queued)
                self._queued.clear()

    def _enqueue(self, job: Job, report: StepReport) -> None:
        try:
            job.params.validate(self.engine.vocab_size)  # before admission does sums with it
            prompt_ids = self._tokenize(job)
        except Exception as exc:  # this request's own input: fail it alone
            report.failures.append((job.key, *_failure(job.key, exc)))
            return
        bisect.insort_right(self._queued, _Queued(job, prompt_ids), key=lambda q: q.job.priority)

    def _tokenize(self, job: Job) -> list[int]:
        tok = self.engine.tokenizer
        if job.prompt_token_ids is not None:
            return list(job.prompt_token_ids)
        if job.messages is not None:
            return tok.apply_chat_template(job.messages)
        return tok.encode(job.prompt or "")

    def _abort(self, key: str, reason: str, report: StepReport) -> None:
        for i, q in enumerate(self._queued):
            if q.job.key == key:
                del self._queued[i]
                report.deltas.extend(RequestDelta(
                    request_id=key, new_token_ids=[], new_text="", finished=True, finish_reason=reason,
                    num_output_tokens=len(_resumed(q.job, c)), index=c)
                    for c in range(q.job.n) if c not in q.job.skip)
                return
        self.sampling.abort_request(key, reason)

    def _admit(self, report: StepReport) -> None:
        """Admit queued requests, highest lane first, while free KV blocks allow."""
        while self._queued:
            q = self._queued[0]
            resume = [_resumed(q.job, c) for c in range(q.job.n)]
            num_resumed = max(map(len, resume))
            fits = self.sampling.can_admit(len(q.prompt_ids) + num_resumed,
                                           q.job.params.max_tokens - num_resumed, q.job.n)
            if not fits and self.sampling.has_unfinished_requests():
                return  # the head waits for blocks; nothing behind it jumps the lane order
            self._queued.pop(0)
            try:
                self.sampling.add_request(
                    q.job.key, q.prompt_ids, q.job.params, n=q.job.n, priority=q.job.priority,
                    resume=resume, skip=q.job.skip, deadline=q.job.deadline)
            except Exception as exc:  # nothing was queued in the engine: fail this one alone
                report.failures.append((q.job.key, *_failure(q.job.key, exc)))
                continue
            report.admitted.append(q.job.key)


def _resumed(job: Job, index: int) -> list[int]:
    """Choice ``index``'s tokens already delivered."""
    if index == 0:
        return job.resume_token_ids
    return job.resume_choices[index] if index < len(job.resume_choices) else []


def _failure(key: str, exc: Exception) -> tuple[str, str]:
    """(code, message) of a request refused at the engine's door."""
    if isinstance(exc, InvalidRequestError):
        return exc.code, exc.message
    logger.exception("request %s failed before it ran", key)
    return INTERNAL, f"the engine could not take this request: {exc!r}"
