"""The worker's log lines besides startup: one per failure and dead letter, and stats.

Failures: ``request rejected`` (info; a client's validation failure) and ``request
dead-lettered`` (warning), each with ``request_id``, ``tenant``, ``code`` (and the entry id)
as structured fields, rate-limited per kind (:class:`shared.logs.RateLimiter`: bursts of 20,
then one a second; the next line let through says how many were ``suppressed``), so a flood
of bad entries costs a few lines a second, never one per entry.

:class:`StatsLogger` logs one ``engine stats`` line every ``interval_s`` (vLLM's periodic
line): requests running and waiting, KV-cache usage, prompt and generation tokens/s, the
prefix-cache hit rate and speculative acceptance over the interval, and requests finished,
rejected and dead-lettered in it. It reads the worker's Prometheus registry from its own
thread (the engine's counters as :class:`~gpu_worker.metrics.WorkerMetrics` mirrors them),
so the engine's loop does no extra work. An idle worker logs one idle line, then none until
work arrives.
"""
from __future__ import annotations

import logging
import time

from shared.logs import RateLimiter
from shared.scan import scan
from shared.stats_line import PeriodicStats, pct

logger = logging.getLogger("gpu_worker.requests")
stats_logger = logging.getLogger("gpu_worker.stats")
LIMITER = RateLimiter(burst=20, per_s=1.0)


def rejected(code: str, message: str, *, request_id=None, tenant=None) -> None:
    LIMITER.log(logger, logging.INFO, "rejected", "request rejected: %s: %s", code,
                message[:200], request_id=request_id, tenant=tenant, code=code)


def dead_letter(code: str, message: str, *, request_id=None, tenant=None,
                entry_id=None) -> None:
    LIMITER.log(logger, logging.WARNING, "dead_letter", "request dead-lettered: %s: %s", code,
                message[:200], request_id=request_id, tenant=tenant, code=code,
                entry_id=entry_id)


def xadd_fields(call: tuple) -> dict | None:
    """The field/value pairs of an ``XADD`` call tuple (None for any other call)."""
    if not call or call[0] != "XADD" or "*" not in call:
        return None
    rest = call[call.index("*") + 1:]
    return dict(zip(rest[::2], rest[1::2]))


def dead_letter_fields(fields: dict) -> None:
    """The line of a dead letter written as these XADD fields (its payload is scanned,
    boundedly, for the request id and tenant)."""
    found = scan(fields.get("data") or b"")
    dead_letter(str(fields.get("code")), str(fields.get("message", "")),
                request_id=found.request_id, tenant=found.tenant,
                entry_id=fields.get("entry_id"))


COUNTERS = {  # field -> the registry's counter, summed over its labels
    "prompt": "fleet:prompt_tokens_total", "generation": "fleet:generation_tokens_total",
    "pq": "fleet:prefix_cache_queries_total", "ph": "fleet:prefix_cache_hits_total",
    "drafted": "fleet:spec_decode_num_draft_tokens_total",
    "accepted": "fleet:spec_decode_num_accepted_tokens_total",
    "finished": "fleet:request_success_total", "rejected": "fleet:requests_rejected_total",
    "dead_lettered": "fleet:requests_dead_lettered_total",
    "preempted": "fleet:num_preemptions_total",
}
GAUGES = {"running": "fleet:num_requests_running", "waiting": "fleet:num_requests_waiting",
          "kv": "fleet:kv_cache_usage_perc"}


def snapshot(registry) -> dict[str, float]:
    """Every counter and gauge the stats line needs, summed over labels."""
    wanted = {v: k for k, v in {**COUNTERS, **GAUGES}.items()}
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 else None


def stats_fields(before: dict, now: dict, seconds: float) -> dict:
    """The structured fields of one stats line, from two snapshots ``seconds`` apart."""
    d = {k: now[k] - before.get(k, 0.0) for k in COUNTERS}
    per_s = max(seconds, 1e-9)
    return {"running": int(now["running"]), "waiting": int(now["waiting"]),
            "kv_cache_usage": round(now["kv"], 4),
            "prompt_tokens_per_s": round(d["prompt"] / per_s, 1),
            "generation_tokens_per_s": round(d["generation"] / per_s, 1),
            "prefix_cache_hit_rate": _ratio(d["ph"], d["pq"]),
            "spec_acceptance": _ratio(d["accepted"], d["drafted"]),
            "finished": int(d["finished"]), "rejected": int(d["rejected"]),
            "dead_lettered": int(d["dead_lettered"]), "preempted": int(d["preempted"])}


def stats_message(f: dict) -> str:
    return (f"engine stats: running {f['running']} reqs, waiting {f['waiting']} reqs, "
            f"KV cache {pct(f['kv_cache_usage'])}, prompt {f['prompt_tokens_per_s']} tokens/s, "
            f"generation {f['generation_tokens_per_s']} tokens/s, prefix cache hit rate "
            f"{pct(f['prefix_cache_hit_rate'])}, spec acceptance {pct(f['spec_acceptance'])}, "
            f"finished {f['finished']}, rejected {f['rejected']}, "
            f"dead-lettered {f['dead_lettered']}")


def _idle(f: dict) -> bool:
    return not (f["running"] or f["waiting"] or f["prompt_tokens_per_s"]
                or f["generation_tokens_per_s"] or f["finished"] or f["rejected"]
                or f["dead_lettered"])


class StatsLogger(PeriodicStats):
    """The worker's :class:`~shared.stats_line.PeriodicStats`: :func:`stats_message` every
    ``interval_s`` (0: never)."""

    def __init__(self, registry, interval_s: float = 10.0, clock=time.monotonic) -> None:
        self.registry = registry
        self._last = snapshot(registry)
        super().__init__(stats_logger, interval_s, clock)

    def measure(self, seconds: float) -> tuple[dict, str, bool]:
        now = snapshot(self.registry)
        fields = stats_fields(self._last, now, seconds)
        self._last = now
        return fields, stats_message(fields), _idle(fields)
