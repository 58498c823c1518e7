"""The gateway's and the exporter's periodic stats lines (the worker's is
:mod:`gpu_worker.worker_log`), each a :class:`shared.stats_line.PeriodicStats` thread that
reads the component's own Prometheus registry every ``--log-stats-interval`` seconds.

``gateway stats`` (logger ``producer.gateway.stats``): requests/s over the interval, by
outcome (2xx, 4xx, 5xx), requests in flight, event streams open, p50/p99 duration over the
interval (interpolated in the duration histogram's buckets, as ``histogram_quantile``
does), and batches running. Probes and scrapes (``/health``, ``/ready``, ``/metrics``) are
left out, so a gateway nobody calls stays quiet.

``exporter stats`` (logger ``producer.exporter.stats``): per model the backlog (lag +
pending) of each lane over every tenant, workers alive and draining, and dead letters. It
reads the queue once per line (one scrape of its registry).
"""
from __future__ import annotations

import logging
import math
import time

from shared.stats_line import PeriodicStats, per_s

QUIET_ROUTES = frozenset({"/health", "/ready", "/metrics"})
OUTCOMES = ("2xx", "4xx", "5xx")
REQUESTS = "fleet:gateway_requests_total"
BUCKET = "fleet:gateway_request_duration_seconds_bucket"
IN_FLIGHT = "fleet:gateway_requests_in_flight"
STREAMS = "fleet:gateway_streams_open"


def gateway_snapshot(registry) -> dict:
    """Answers by outcome, cumulative duration buckets (le -> count), in flight and
    streams open, summed over the labels of every route but the quiet ones."""
    out = {"answers": dict.fromkeys(OUTCOMES, 0.0), "other": 0.0, "buckets": {},
           "in_flight": 0.0, "streams_open": 0.0}
    for family in registry.collect():
        for s in family.samples:
            if s.labels.get("route") in QUIET_ROUTES:
                continue
            if s.name == REQUESTS:
                kind = s.labels["status"][:1] + "xx"
                if kind in out["answers"]:
                    out["answers"][kind] += s.value
                else:
                    out["other"] += s.value
            elif s.name == BUCKET:
                le = float(s.labels["le"])
                out["buckets"][le] = out["buckets"].get(le, 0.0) + s.value
            elif s.name == IN_FLIGHT:
                out["in_flight"] += s.value
            elif s.name == STREAMS:
                out["streams_open"] += s.value
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The ``q`` quantile of cumulative bucket counts (None when they count nothing):
    linear within its bucket, the highest finite bound when it lies in ``+Inf``'s."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank and count > below:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = (le if not math.isinf(le) else lower), count
    return lower


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def gateway_fields(before: dict, now: dict, seconds: float,
                   batches_running: int | None = None) -> dict:
    """The fields of one gateway line, from two snapshots ``seconds`` apart."""
    d = {k: now["answers"][k] - before["answers"].get(k, 0.0) for k in OUTCOMES}
    total = sum(d.values()) + now["other"] - before["other"]
    buckets = {le: n - before["buckets"].get(le, 0.0) for le, n in now["buckets"].items()}
    return {"requests": int(total), "requests_per_s": per_s(total, seconds),
            **{f"requests_{k}_per_s": per_s(d[k], seconds) for k in OUTCOMES},
            "in_flight": int(now["in_flight"]), "streams_open": int(now["streams_open"]),
            "p50_ms": _ms(quantile(0.5, buckets)), "p99_ms": _ms(quantile(0.99, buckets)),
            "batches_running": batches_running}


def _or_na(x, unit: str = "") -> str:
    return "n/a" if x is None else f"{x}{unit}"


def gateway_message(f: dict) -> str:
    return (f"gateway stats: {f['requests_per_s']} req/s (2xx {f['requests_2xx_per_s']}, "
            f"4xx {f['requests_4xx_per_s']}, 5xx {f['requests_5xx_per_s']}), in flight "
            f"{f['in_flight']}, streams open {f['streams_open']}, p50 {_or_na(f['p50_ms'], ' ms')}, "
            f"p99 {_or_na(f['p99_ms'], ' ms')}, batches running {_or_na(f['batches_running'])}")


class GatewayStats(PeriodicStats):
    """``batches_running``: a callable giving the batch runner's jobs (None: unknown)."""

    def __init__(self, registry, interval_s: float = 10.0, clock=time.monotonic,
                 batches_running=None) -> None:
        self.registry, self.batches_running = registry, batches_running
        self._last = gateway_snapshot(registry)
        super().__init__(logging.getLogger("producer.gateway.stats"), interval_s, clock)

    def measure(self, seconds: float) -> tuple[dict, str, bool]:
        now = gateway_snapshot(self.registry)
        batches = self.batches_running() if self.batches_running else None
        fields = gateway_fields(self._last, now, seconds, batches)
        self._last = now
        idle = not (fields["requests"] or fields["in_flight"] or fields["streams_open"]
                    or batches)
        return fields, gateway_message(fields), idle


def exporter_snapshot(registry) -> dict:
    """``up`` and, per model, backlog by lane (lag + pending over its tenants), workers
    alive and draining, dead letters: from one collection of the exporter's registry."""
    out: dict = {"up": False, "models": {}}
    names = {"fleet:workers_alive": "workers_alive", "fleet:workers_draining":
             "workers_draining", "fleet:dead_letters": "dead_letters"}
    for family in registry.collect():
        for s in family.samples:
            if s.name == "fleet:queue_up":
                out["up"] = s.value == 1
                continue
            model = s.labels.get("model_name")
            if model is None:
                continue
            m = out["models"].setdefault(model, {"backlog": {}, "workers_alive": 0,
                                                 "workers_draining": 0, "dead_letters": 0})
            if s.name in ("fleet:stream_lag", "fleet:stream_pending"):
                lane = s.labels["lane"]
                m["backlog"][lane] = m["backlog"].get(lane, 0) + int(s.value)
            elif s.name in names:
                m[names[s.name]] = int(s.value)
    return out


def exporter_message(snap: dict) -> str:
    if not snap["up"]:
        return "exporter stats: the queue cannot be read"
    parts = []
    for model, m in sorted(snap["models"].items()):
        lanes = ", ".join(f"{lane} {n}" for lane, n in sorted(m["backlog"].items()))
        parts.append(f"{model}: backlog {sum(m['backlog'].values())} ({lanes or 'no lanes'}), "
                     f"workers {m['workers_alive']} alive, {m['workers_draining']} draining, "
                     f"dead letters {m['dead_letters']}")
    return "exporter stats: " + ("; ".join(parts) or "no models")


class ExporterStats(PeriodicStats):
    """Idle: the queue read, nothing owed, and workers and dead letters as at the last
    line."""

    def __init__(self, registry, interval_s: float = 10.0, clock=time.monotonic) -> None:
        self.registry = registry
        self._last: dict | None = None
        super().__init__(logging.getLogger("producer.exporter.stats"), interval_s, clock)

    def measure(self, seconds: float) -> tuple[dict, str, bool]:
        snap = exporter_snapshot(self.registry)
        backlog = sum(sum(m["backlog"].values()) for m in snap["models"].values())
        state = {name: (m["workers_alive"], m["workers_draining"], m["dead_letters"])
                 for name, m in snap["models"].items()}
        idle = snap["up"] and not backlog and self._last in (None, state)
        self._last = state
        fields = {"up": snap["up"], "backlog_total": backlog, "models": snap["models"]}
        return fields, exporter_message(snap), idle
