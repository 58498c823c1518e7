"""``fleet exporter``: the queue itself as Prometheus metrics -- the autoscaler's signals.

Workers report their own load (``fleet worker --metrics-port``); this reports what no worker
can see once they are all gone: per lane the stream length, the consumer group's lag
(entries never delivered) and pending entries (delivered, not yet acknowledged), the dead
letters, and how many workers are alive by their heartbeats. ``fleet:queue_backlog`` (lag +
pending, all lanes) is the work the fleet owes; at zero workers it is what wakes them.

Redis is read on every scrape (``producer.status.collect``, the same numbers as ``fleet
status``), so the numbers are never staler than the scrape. Unless ``--no-ensure-groups``,
the exporter creates the consumer group of every lane (from id 0, as workers do): a
fleet scaled to zero on a fresh or restarted Redis then still has a group whose lag an
autoscaler can read.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis.asyncio as aioredis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from redis.exceptions import ResponseError

from producer import status
from shared import keys

logger = logging.getLogger(__name__)

STREAM_GAUGES = {  # metric -> (key in status.collect's report, help)
    "fleet:stream_length": ("length", "Entries in the lane's request stream (acked ones are deleted)"),
    "fleet:stream_lag": ("lag", "Entries not yet delivered to any worker"),
    "fleet:stream_pending": ("pending", "Entries delivered to a worker and not yet acknowledged"),
    "fleet:stream_consumers": ("consumers", "Consumers in the lane's group (live or not)"),
}


async def ensure_groups(redis_url: str, model: str) -> None:
    """Create every lane's consumer group from id 0 (never ``$``), as a worker would."""
    client = aioredis.from_url(redis_url)
    try:
        for lane in keys.LANES:
            try:
                await client.xgroup_create(keys.stream_key(model, lane), keys.GROUP, id="0",
                                           mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
    finally:
        await client.aclose()


class QueueCollector:
    """A prometheus-client collector that reads Redis at scrape time."""

    def __init__(self, redis_url: str, models: list[str], *, ensure: bool = True) -> None:
        self.redis_url = redis_url
        self.models = [keys.check_model(m) for m in models]
        self.ensure = ensure
        self._lock = threading.Lock()  # one scrape at a time hits Redis

    async def _reports(self) -> list[dict]:
        reports = []
        for model in self.models:
            if self.ensure:
                await ensure_groups(self.redis_url, model)
            reports.append(await status.collect(self.redis_url, model))
        return reports

    def collect(self):
        started = time.perf_counter()
        up = GaugeMetricFamily("fleet:queue_up", "1 if Redis answered this scrape")
        try:
            with self._lock:
                reports = asyncio.run(self._reports())
        except Exception as exc:  # a scrape never raises: it says Redis is down
            logger.warning("cannot read the queue: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families(reports)
        took = GaugeMetricFamily("fleet:exporter_scrape_seconds", "Time to read the queue")
        took.add_metric([], time.perf_counter() - started)
        yield took


def families(reports: list[dict]):
    """Metric families from ``status.collect`` reports (one per model)."""
    streams = {name: GaugeMetricFamily(name, doc, labels=["model_name", "lane"])
               for name, (_, doc) in STREAM_GAUGES.items()}
    backlog = GaugeMetricFamily("fleet:queue_backlog", "Lag plus pending over all lanes: "
                                "the work the fleet owes (autoscaling signal)", labels=["model_name"])
    dead = GaugeMetricFamily("fleet:dead_letters", "Entries in the dead-letter stream",
                             labels=["model_name"])
    alive = GaugeMetricFamily("fleet:workers_alive", "Workers with a live heartbeat",
                              labels=["model_name"])
    draining = GaugeMetricFamily("fleet:workers_draining", "Live workers that are draining",
                                 labels=["model_name"])
    for report in reports:
        model = report["model"]
        owed = 0
        for lane, s in report["streams"].items():
            for name, (field, _) in STREAM_GAUGES.items():
                streams[name].add_metric([model, lane], s[field])
            owed += s["lag"] + s["pending"]
        backlog.add_metric([model], owed)
        dead.add_metric([model], report["dead_letters"])
        live = [w for w in report["workers"].values() if w["alive"]]
        alive.add_metric([model], len(live))
        draining.add_metric([model], sum(str(w.get("draining", "0")) == "1" for w in live))
    yield from streams.values()
    yield from (backlog, dead, alive, draining)


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("exporter", help="serve the queue's metrics (lag, pending, dead letters, "
                                        "workers alive) for Prometheus and autoscalers")
    add_common(p)
    p.add_argument("--models", default=None,
                   help="comma-separated model names to export (default: --model-name)")
    p.add_argument("--port", type=int, default=9400, help="HTTP port of /metrics")
    p.add_argument("--host", default="0.0.0.0", help="address to bind")
    p.add_argument("--no-ensure-groups", action="store_true",
                   help="do not create missing consumer groups (read-only ACL users)")
    p.set_defaults(_run=run)


def registry_for(redis_url: str, models: list[str], *, ensure: bool = True) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(redis_url, models, ensure=ensure))
    return registry


def run(args: argparse.Namespace) -> int:
    logging.getLogger().setLevel(logging.INFO)
    models = [m for m in (args.models or args.model_name).split(",") if m]
    registry = registry_for(args.redis_url, models, ensure=not args.no_ensure_groups)
    server = ThreadingHTTPServer((args.host, args.port), _handler(registry))
    server.daemon_threads = True
    logger.info("exporting %s on http://%s:%d/metrics", ",".join(models), args.host,
                server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def _handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    """Always the classic text format: prometheus-client's OpenMetrics negotiation would
    rewrite the ``fleet:`` colons to underscores, so names would differ by scraper."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:
            logger.debug("http: " + fmt, *args)

    return Handler
