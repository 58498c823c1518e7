"""Prometheus metrics of one worker, named as vLLM names its own (``vllm:`` -> ``fleet:``).

Every metric lives in the worker's own :class:`CollectorRegistry` (never the global one),
labelled with ``model_name`` (the worker's ``--model-name``). The worker's event-loop thread
calls :meth:`WorkerMetrics.on_report` once per engine pass (steps, load, admissions, token
deltas), :meth:`on_terminal` for requests ended before any engine work, :meth:`on_dead_letter`
and :meth:`on_reclaim`. A failure is a client's *rejection* (a validation code:
``fleet:requests_rejected_total{code}``, never dead-lettered) or a *dead letter*
(``fleet:requests_dead_lettered_total{reason}``, see :mod:`shared.failures`); each gets a
rate-limited log line (:mod:`gpu_worker.worker_log`). ``health`` answers the probes.

Times: "enqueue" is the Redis server time of the XADD, read from the stream entry id (one
clock for every worker, immune to a client's clock). TTFT and end-to-end latency run from
it, as users see them; queue time from it to admission. A request resumed from another
worker's progress observes neither TTFT nor queue time again (the first worker did).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from gpu_worker import worker_log
from gpu_worker.health import Health
from shared.failures import REASONS, dead_letter_reason, is_rejection

RESULT_REASONS = ("stop", "length", "cancelled", "timeout")
NOT_FINISHED_HERE = ("handoff", "fenced")  # the request goes on elsewhere
MAX_TENANT_LABELS = 100

# vLLM's buckets, so dashboards and SLOs carry over.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                5.12, 10.24)


def enqueue_time(entry_id: str) -> float:
    """Unix seconds at which Redis accepted the entry (its id is ``<ms>-<seq>``)."""
    return int(entry_id.split("-", 1)[0]) / 1000.0


@dataclass
class _Live:
    """What the metrics remember of one request running here (of one of its n samples)."""
    last_token_at: float | None = None
    prompt_counted: bool = False


class WorkerMetrics:
    def __init__(self, model_name: str = "default", *,
                 registry: CollectorRegistry | None = None, process: bool = False) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        if process:  # CPU, memory, fds of this process (Linux)
            ProcessCollector(registry=self.registry)
        self.health = Health()
        self._live: dict[tuple[str, int], _Live] = {}
        self._ended: dict[str, tuple[int, str]] = {}  # n > 1: samples ended so far, sample 0's end
        self._totals: dict[tuple, float] = {}  # last cumulative engine counters seen
        g, c, h = self._gauge, self._counter, self._histogram
        self.running = g("fleet:num_requests_running", "Requests in the engine's running batch")
        self.waiting = g("fleet:num_requests_waiting",
                         "Requests held but not running: engine waiting queue plus the local queue")
        self.kv_usage = g("fleet:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)")
        self.free_blocks = g("fleet:num_free_blocks", "Free KV-cache blocks")
        self.prefix_queries = c("fleet:prefix_cache_queries", "Prefix-cache lookups, in blocks")
        self.prefix_hits = c("fleet:prefix_cache_hits", "Prefix-cache hits, in blocks")
        self.prompt_tokens = c("fleet:prompt_tokens", "Prompt tokens of requests run here")
        self.generation_tokens = c("fleet:generation_tokens", "Tokens generated and published")
        self.preemptions = c("fleet:num_preemptions", "Requests preempted (recomputed later)")
        self.ttft = h("fleet:time_to_first_token_seconds",
                      "Enqueue (Redis XADD) to first generated token", TTFT_BUCKETS)
        self.itl = h("fleet:inter_token_latency_seconds",
                     "Time between successive token deltas of a request", ITL_BUCKETS)
        self.e2e = h("fleet:e2e_request_latency_seconds",
                     "Enqueue to final result, requests finished here", LATENCY_BUCKETS)
        self.queue_time = h("fleet:request_queue_time_seconds",
                            "Enqueue to admission into the engine", LATENCY_BUCKETS)
        self.step_time = h("fleet:engine_step_seconds", "Wall time of one engine step",
                           STEP_BUCKETS)
        self.spec_drafted = c("fleet:spec_decode_num_draft_tokens", "Speculative tokens drafted",
                              ("proposer",))
        self.spec_accepted = c("fleet:spec_decode_num_accepted_tokens",
                               "Speculative tokens accepted", ("proposer",))
        self.success = c("fleet:request_success", "Requests finished with a result, by reason",
                         ("finished_reason",))
        self.failure = c("fleet:request_failure", "Requests ended with a typed failure, by code",
                         ("code",))
        self.reclaimed = c("fleet:leases_reclaimed", "Entries of dead or draining workers "
                           "taken over (XAUTOCLAIM)")
        self.rejected = c("fleet:requests_rejected", "Requests refused as sent (client "
                          "validation failures, not dead-lettered), by code", ("code",))
        self.dead_lettered = c("fleet:requests_dead_lettered", "Entries moved to the dead-letter "
                               "stream by this worker, by reason (poison, malformed, internal)",
                               ("reason",))
        for reason in REASONS:  # every series exists from the start: increase() sees the first
            self.dead_lettered.labels(self.model_name, reason)
        self.cancelled = c("fleet:requests_cancelled", "Requests that ended cancelled")
        self.redis_errors = c("fleet:redis_errors", "Redis errors met, by class (transient, "
                              "missing, denied, oom, redirect, request)", ("kind",))
        self.refusing_writes = g("fleet:redis_refusing_writes",
                           "1 while Redis refuses writes (out of memory): no new work is read")
        self.tenant_held = Gauge("fleet:tenant_requests_held", "Requests of a tenant held here "
                                 "(running or waiting)", ["model_name", "tenant"],
                                 registry=self.registry)
        self.tenant_tokens = c("fleet:tenant_generation_tokens", "Tokens generated for a tenant",
                               ("tenant",))
        self._tenant_labels: dict[str, str] = {}

    # -- construction ------------------------------------------------------------------
    def _gauge(self, name: str, doc: str):
        return Gauge(name, doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()):
        metric = Counter(name, doc, ["model_name", *extra], registry=self.registry)
        return metric if extra else metric.labels(self.model_name)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]):
        metric = Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry)
        return metric.labels(self.model_name)

    # -- the observer API ----------------------------------------------------------------
    def on_report(self, report, inflight: dict, now: float | None = None) -> None:
        """One engine pass (a :class:`~gpu_worker.edge.engine_loop.StepReport`), as soon as
        the event loop receives it. ``inflight`` maps engine keys to held requests."""
        now = time.time() if now is None else now
        self.health.engine_pass(report)
        self.on_step(report.step_time, report.stats, num_queued=report.num_queued)
        for key in report.admitted:
            inf = inflight.get(key)
            if inf is not None and not inf.prior_token_ids:
                # admitted just before this pass's step ran
                self.on_admit(enqueue_time(inf.entry.entry_id), now - report.step_time)
        for key, code, message in report.failures:
            if key in inflight:  # else fenced: another worker owns it now
                self._engine_failure(inflight[key], key, code, message)
        for delta in report.deltas:
            inf = inflight.get(delta.request_id)
            if inf is not None:  # otherwise fenced: another worker owns it now
                self.on_delta(delta, enqueue_time(inf.entry.entry_id), now,
                              resumed=bool(inf.prior_token_ids),
                              num_choices=getattr(getattr(inf, "request", None), "n", 1))
                if delta.new_token_ids:
                    self.tenant_tokens.labels(self.model_name, self.tenant_label(
                        getattr(inf, "tenant", "default"))).inc(len(delta.new_token_ids))
        self.on_held(inflight)

    def tenant_label(self, tenant: str) -> str:
        """The tenant's label value: its name for the first MAX_TENANT_LABELS seen, then
        ``_other`` (label cardinality stays bounded however many tenants there are)."""
        label = self._tenant_labels.get(tenant)
        if label is None:
            label = tenant if len(self._tenant_labels) < MAX_TENANT_LABELS else "_other"
            self._tenant_labels[tenant] = label
        return label

    def on_held(self, inflight: dict) -> None:
        counts = dict.fromkeys(set(self._tenant_labels.values()), 0)
        for inf in inflight.values():
            label = self.tenant_label(getattr(inf, "tenant", "default"))
            counts[label] = counts.get(label, 0) + 1
        for label, n in counts.items():
            self.tenant_held.labels(self.model_name, label).set(n)

    def on_step(self, duration: float, stats: dict, *, num_queued: int = 0) -> None:
        """Load after a pass; ``duration`` is 0 when no step ran."""
        if duration > 0:
            self.step_time.observe(duration)
        if not stats:
            return
        self.running.set(stats.get("num_running", 0))
        self.waiting.set(stats.get("num_waiting", 0) + num_queued)
        self.kv_usage.set(stats.get("kv_usage", 0.0))
        self.free_blocks.set(stats.get("num_free_blocks", 0))
        self._advance(self.prefix_queries, ("pq",), stats.get("prefix_cache_queries"))
        self._advance(self.prefix_hits, ("ph",), stats.get("prefix_cache_hits"))
        self._advance(self.preemptions, ("pre",), stats.get("num_preemptions"))
        for proposer, n in (stats.get("spec_drafted_tokens") or {}).items():
            self._advance(self.spec_drafted.labels(self.model_name, proposer), ("sd", proposer), n)
        for proposer, n in (stats.get("spec_accepted_tokens") or {}).items():
            self._advance(self.spec_accepted.labels(self.model_name, proposer), ("sa", proposer), n)

    def _advance(self, counter, key: tuple, total) -> None:
        """Move ``counter`` by the growth of the engine's cumulative ``total``."""
        if total is None:
            return
        last = self._totals.get(key, 0)
        if total > last:
            counter.inc(total - last)
        self._totals[key] = total

    def on_admit(self, enqueue_ts: float, now: float) -> None:
        self.queue_time.observe(max(now - enqueue_ts, 0.0))

    def on_delta(self, delta, enqueue_ts: float, now: float, *, resumed: bool = False,
                 num_choices: int = 1) -> None:
        """One request's output of one step (a :class:`~gpu_worker.outputs.RequestDelta`).
        With n > 1 samples, latencies are per sample, and the request is counted as
        finished (by sample 0's reason) once, when its last sample ends."""
        index = getattr(delta, "index", 0)
        live = self._live.setdefault((delta.request_id, index), _Live())
        if delta.num_prompt_tokens and not live.prompt_counted:
            live.prompt_counted = True
            if index == 0:  # the samples share the prompt
                self.prompt_tokens.inc(delta.num_prompt_tokens)
        if delta.new_token_ids:
            self.generation_tokens.inc(len(delta.new_token_ids))
            if live.last_token_at is not None:
                self.itl.observe(max(now - live.last_token_at, 0.0))
            elif not resumed and index == 0:
                self.ttft.observe(max(now - enqueue_ts, 0.0))
            live.last_token_at = now
        if not delta.finished:
            return
        del self._live[(delta.request_id, index)]
        reason = delta.finish_reason or "error"
        if num_choices > 1:
            reason = self._last_sample(delta, reason, num_choices)
            if reason is None:
                return
        if reason in NOT_FINISHED_HERE:
            return
        if reason in RESULT_REASONS:
            self.e2e.observe(max(now - enqueue_ts, 0.0))
            self._finished(reason)
        else:
            self.failure.labels(self.model_name, delta.error_code or "internal").inc()

    def _last_sample(self, delta, reason: str, num_choices: int) -> str | None:
        """Count one sample's end: sample 0's reason once the request's last one ended."""
        ended, first = self._ended.get(delta.request_id, (0, ""))
        ended, first = ended + 1, (reason if delta.index == 0 else first)
        if ended < num_choices:
            self._ended[delta.request_id] = (ended, first)
            return None
        self._ended.pop(delta.request_id, None)
        return first

    def on_terminal(self, event, tenant: str | None = None) -> None:
        """A request ended before any engine work (cancelled or expired in the queue, all
        tokens already generated, poison, malformed): its stored terminal event. Its dead
        letter, if any, is counted by :meth:`on_dead_letter_writes`."""
        reason = getattr(event, "finish_reason", None)
        if reason is not None:
            self._finished(reason)
        else:
            self._failed(event.code, getattr(event, "message", ""),
                         getattr(event, "request_id", None), tenant)

    def _engine_failure(self, inf, key: str, code: str, message: str) -> None:
        """A held request the engine failed: stored as a failure by the publisher, and
        dead-lettered unless a rejection."""
        tenant = getattr(inf, "tenant", None)
        request_id = getattr(getattr(inf, "request", None), "request_id", key)
        self._failed(code, message, request_id, tenant)
        if not is_rejection(code):
            self.on_dead_letter(reason=dead_letter_reason(code))
            worker_log.dead_letter(code, message, request_id=request_id, tenant=tenant,
                                   entry_id=inf.entry.entry_id)

    def _failed(self, code: str, message: str, request_id, tenant) -> None:
        self.failure.labels(self.model_name, code).inc()
        if is_rejection(code):
            self.rejected.labels(self.model_name, code).inc()
            worker_log.rejected(code, message, request_id=request_id, tenant=tenant)

    def _finished(self, reason: str) -> None:
        self.success.labels(self.model_name, reason).inc()
        if reason == "cancelled":
            self.cancelled.inc()

    def on_reclaim(self, num_entries: int = 1) -> None:
        if num_entries:
            self.reclaimed.inc(num_entries)

    def on_redis_error(self, kind: str) -> None:
        self.redis_errors.labels(self.model_name, kind).inc()

    def redis_refusing(self, refusing: bool) -> None:
        self.refusing_writes.set(1 if refusing else 0)

    def on_dead_letter(self, num_entries: int = 1, reason: str = "internal") -> None:
        if num_entries:
            self.dead_lettered.labels(self.model_name, reason).inc(num_entries)

    def on_dead_letter_writes(self, writes: list[tuple]) -> None:
        """Count (and log) the dead letters among an entry's stored ending writes."""
        for fields in filter(None, map(worker_log.xadd_fields, writes)):
            self.on_dead_letter(reason=dead_letter_reason(fields.get("code")))
            worker_log.dead_letter_fields(fields)


DISABLED = WorkerMetrics("disabled")  # a sink for callers that do not serve metrics
