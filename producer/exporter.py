"""``fleet exporter``: the queue itself as Prometheus metrics -- the autoscaler's signals.

Workers report their own load (``fleet worker --metrics-port``); this reports what no worker
can see once they are all gone: per tenant and lane the stream length, the consumer group's
lag (entries never delivered) and pending entries (delivered, not yet acknowledged), the old
shared streams while they hold anything (tenant ``_legacy``), the dead letters, and how many
workers are alive by their heartbeats. ``fleet:queue_backlog`` (lag + pending over every
tenant and lane) is the work the fleet owes; at zero workers it is what wakes them.

Label cardinality is bounded: the first ``--max-tenants`` tenants by name get their own
``tenant`` label, the rest are summed under ``tenant="_other"``.

Redis is read on every scrape (``producer.status``, the same numbers as ``fleet status``;
per-key commands only, so one server or a Redis Cluster given any node's URL), so the
numbers are never staler than the scrape. Unless ``--no-ensure-groups``, the exporter
creates the consumer group of every registered tenant's allowed lane streams (from id 0,
as workers do): a fleet scaled to zero on a fresh or restarted Redis then still has groups
whose lag an autoscaler can read.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from producer import status
from producer.stats_log import ExporterStats
from shared import connect, keys, logs
from shared.tenants import TenantConfig

logger = logging.getLogger(__name__)

STREAM_GAUGES = {  # metric -> (key in status.collect's report, help)
    "fleet:stream_length": ("length", "Entries in the tenant's lane stream (acked ones are deleted)"),
    "fleet:stream_lag": ("lag", "Entries not yet delivered to any worker"),
    "fleet:stream_pending": ("pending", "Entries delivered to a worker and not yet acknowledged"),
    "fleet:stream_consumers": ("consumers", "Consumers in the stream's group (live or not)"),
}
OTHER = "_other"  # the tenants beyond --max-tenants, summed (no tenant name starts with _)
LEGACY = "_legacy"  # the old shared streams (still drained after an upgrade)


async def ensure_groups(client, model: str, configs: dict[str, TenantConfig]) -> None:
    """Create the consumer group of every registered tenant's allowed lane streams, from
    id 0 (never ``$``), as a worker would. One pipeline (per node on a cluster)."""
    streams = [keys.stream_key(model, name, lane) for name, c in configs.items() for lane in c.lanes]
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    for reply in await pipe.execute(raise_on_error=False):
        if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
            raise reply


class QueueCollector:
    """A prometheus-client collector that reads Redis at scrape time."""

    def __init__(self, redis_url: str, models: list[str], *, ensure: bool = True,
                 max_tenants: int = 100) -> None:
        self.redis_url = redis_url
        self.models = [keys.check_model(m) for m in models]
        self.ensure = ensure
        self.max_tenants = max_tenants
        self._lock = threading.Lock()  # one scrape at a time hits Redis
        self._dead: dict[str, int] = {}  # model -> dead-letter stream length at the last scrape

    async def _reports(self) -> list[dict]:
        client = await connect.async_client(self.redis_url, decode_responses=True)
        try:
            registry = await status.read_registry(client)
            reports = []
            for model in self.models:
                if self.ensure:
                    await ensure_groups(client, model, registry[0])
                reports.append(await status.collect_from(client, model, registry))
            return reports
        finally:
            await client.aclose()

    def collect(self):
        started = time.perf_counter()
        up = GaugeMetricFamily("fleet:queue_up", "1 if Redis answered this scrape")
        try:
            with self._lock:  # the stats line's thread scrapes too: a new dead letter logs once
                reports = asyncio.run(self._reports())
                self._log_new_dead_letters(reports)
        except Exception as exc:  # a scrape never raises: it says Redis is down
            logger.warning("cannot read the queue: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families(reports, self.max_tenants)
        took = GaugeMetricFamily("fleet:exporter_scrape_seconds", "Time to read the queue")
        took.add_metric([], time.perf_counter() - started)
        yield took


    def _log_new_dead_letters(self, reports: list[dict]) -> None:
        """One line per scrape that finds the dead-letter stream longer than the last one."""
        for report in reports:
            model, now = report["model"], report["dead_letters"]
            before = self._dead.get(model)
            self._dead[model] = now
            if before is not None and now > before:
                logger.warning("%d new dead letters of %s (%d in %s)", now - before, model, now,
                               keys.dead_letter_key(model),
                               extra={"model_name": model, "new_dead_letters": now - before})


def bounded(report: dict, max_tenants: int) -> dict[str, dict[str, dict]]:
    """tenant label -> lane -> numbers: the first ``max_tenants`` tenants by name, the rest
    summed under ``_other``, the old shared streams under ``_legacy``. Label values stay a
    bounded set however many tenants register."""
    names = sorted(report["tenants"])
    out = {name: report["tenants"][name] for name in names[:max_tenants]}
    rest: dict[str, dict] = {}
    for name in names[max_tenants:]:
        for lane, s in report["tenants"][name].items():
            total = rest.setdefault(lane, dict.fromkeys(status.FIELDS, 0))
            for field in status.FIELDS:
                total[field] += s[field]
    if rest:
        out[OTHER] = rest
    if report["legacy"]:
        out[LEGACY] = report["legacy"]
    return out


def families(reports: list[dict], max_tenants: int = 100):
    """Metric families from ``status.collect`` reports (one per model)."""
    labels = ["model_name", "tenant", "lane"]
    streams = {name: GaugeMetricFamily(name, doc, labels=labels)
               for name, (_, doc) in STREAM_GAUGES.items()}
    backlog = GaugeMetricFamily("fleet:queue_backlog", "Lag plus pending over all tenants and "
                                "lanes: the work the fleet owes (autoscaling signal)",
                                labels=["model_name"])
    by_tenant = GaugeMetricFamily("fleet:tenant_backlog", "Lag plus pending of one tenant over "
                                  "its lanes", labels=["model_name", "tenant"])
    dead = GaugeMetricFamily("fleet:dead_letters", "Entries in the dead-letter stream",
                             labels=["model_name"])
    alive = GaugeMetricFamily("fleet:workers_alive", "Workers with a live heartbeat",
                              labels=["model_name"])
    draining = GaugeMetricFamily("fleet:workers_draining", "Live workers that are draining",
                                 labels=["model_name"])
    registered = GaugeMetricFamily("fleet:tenants_registered", "Tenants the fleet serves (1 for "
                                   "the implicit default of an empty registry)")
    invalid = GaugeMetricFamily("fleet:tenants_invalid", "Registry entries workers ignore "
                                "because they do not decode")
    for report in reports:
        model = report["model"]
        for tenant, lanes in bounded(report, max_tenants).items():
            for lane, s in lanes.items():
                for name, (field, _) in STREAM_GAUGES.items():
                    streams[name].add_metric([model, tenant, lane], s[field])
            by_tenant.add_metric([model, tenant], sum(s["lag"] + s["pending"] for s in lanes.values()))
        backlog.add_metric([model], sum(s["lag"] + s["pending"] for s in report["streams"].values()))
        dead.add_metric([model], report["dead_letters"])
        live = [w for w in report["workers"].values() if w["alive"]]
        alive.add_metric([model], len(live))
        draining.add_metric([model], sum(str(w.get("draining", "0")) == "1" for w in live))
    if reports:
        registered.add_metric([], len(reports[0]["tenants"]))
        invalid.add_metric([], len(reports[0]["invalid_tenants"]))
    yield from streams.values()
    yield from (backlog, by_tenant, dead, alive, draining, registered, invalid)


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
    p.add_argument("--max-tenants", type=int, default=100,
                   help="tenants labelled by name; the rest are summed as tenant=\"_other\"")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between 'exporter stats' log lines, each one read of the "
                        "queue (0: none)")
    logs.add_arguments(p)
    p.set_defaults(_run=run)


def registry_for(redis_url: str, models: list[str], *, ensure: bool = True,
                 max_tenants: int = 100) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(redis_url, models, ensure=ensure, max_tenants=max_tenants))
    return registry


def run(args: argparse.Namespace) -> int:
    logs.configure_from(args)
    models = [m for m in (args.models or args.model_name).split(",") if m]
    registry = registry_for(args.redis_url, models, ensure=not args.no_ensure_groups,
                            max_tenants=args.max_tenants)
    server = ThreadingHTTPServer((args.host, args.port), _handler(registry))
    ExporterStats(registry, args.log_stats_interval).start()
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
