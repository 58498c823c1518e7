"""Liveness, readiness and the worker's HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``).

Probes are answered from a plain thread, so they still answer -- truthfully -- when the
event loop or the engine thread is stuck.

- live (``/healthz``): the process is making progress. While the model loads: yes (give
  loading a startup probe). Serving: the event loop ticked within ``loop_stall_s``, the
  engine thread is alive, and an engine with work finished a pass within
  ``engine_stall_s``. A lost Redis does not make a worker unlive: it reconnects with
  backoff, and restarting it would not help.
- ready (``/readyz``): serving, not draining, engine thread alive, and Redis answering
  (not ready while it refuses the worker: lost, out of memory, permission denied, a
  cluster redirect). Not ready while the model loads, while connecting to Redis for the
  first time, or after SIGTERM.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

logger = logging.getLogger(__name__)


class Health:
    def __init__(self, *, loop_stall_s: float = 30.0, engine_stall_s: float = 120.0) -> None:
        self.loop_stall_s = loop_stall_s
        self.engine_stall_s = engine_stall_s
        self.phase = "loading"  # loading -> serving -> stopped
        self._state = None  # the worker's WorkerState, once serving
        self._loop_beat = time.monotonic()
        self._engine_pass = time.monotonic()
        self._engine_busy = False

    # -- fed by the worker ---------------------------------------------------------------
    def serving(self, state) -> None:
        """The engine is loaded and the worker reads from Redis."""
        self._state = state
        self._loop_beat = self._engine_pass = time.monotonic()
        self.phase = "serving"

    def stopped(self) -> None:
        self.phase = "stopped"

    def engine_pass(self, report) -> None:
        stats = report.stats or {}
        self._engine_pass = time.monotonic()
        self._engine_busy = bool(stats.get("num_running") or stats.get("num_waiting")
                                 or report.num_queued)

    async def loop_heartbeat(self, interval_s: float = 1.0) -> None:
        """A task of the worker's event loop; a stuck loop stops ticking."""
        while True:
            self._loop_beat = time.monotonic()
            await asyncio.sleep(interval_s)

    # -- read by the probes --------------------------------------------------------------
    def live(self) -> tuple[bool, str]:
        if self.phase != "serving":
            return True, self.phase
        now = time.monotonic()
        if now - self._loop_beat > self.loop_stall_s:
            return False, f"event loop stalled {now - self._loop_beat:.0f}s"
        if not self._state.engine.alive:
            return False, "engine thread died"
        if self._engine_busy and now - self._engine_pass > self.engine_stall_s:
            return False, f"engine step stalled {now - self._engine_pass:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.phase != "serving":
            return False, self.phase
        if self._state.draining:
            return False, "draining"
        if not self._state.engine.alive:
            return False, "engine thread died"
        if self._state.redis.problem is not None:
            return False, f"redis: {self._state.redis.problem.value}"
        return True, "ok"


def _handler(metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = (metrics.health.live if path == "/healthz" else metrics.health.ready)()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # probes every few seconds: quiet
            logger.debug("http: " + fmt, *args)

    return Handler


def serve_http(metrics, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``metrics`` (a :class:`~gpu_worker.metrics.WorkerMetrics`) and its probes from a
    daemon thread; ``server.shutdown()`` stops it."""
    server = ThreadingHTTPServer((host, port), _handler(metrics))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    logger.info("metrics and probes on http://%s:%d/metrics", host, server.server_address[1])
    return server
