"""The gateway's own Prometheus metrics, served on its port at ``/metrics``.

``fleet:gateway_requests_total{route,method,status}`` counts every HTTP answer (errors the
gateway shapes included); ``fleet:gateway_request_duration_seconds{route,method}`` is the
time from the request's arrival to the end of its answer (for a stream: its last event);
``fleet:gateway_requests_in_flight{route}`` is what is being answered now, and
``fleet:gateway_streams_open`` the event streams (SSE answers) among them. ``route`` is the
matched route's path template (``/v1/chat/completions``), or ``other`` for a path that
matches none, so label values stay bounded whatever clients send. Every error answer also
gets a log line (``request failed``: route, method, status and the OpenAI error's ``code``;
info for a 4xx, warning for a 5xx), rate-limited as the worker's are
(:class:`shared.logs.RateLimiter`). Each app has its own
registry (never the process-global one). The text format is always the classic one, so
the ``fleet:`` names keep their colons (as the exporter's do).
"""
from __future__ import annotations

import json
import logging
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.logs import RateLimiter

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, 600.0)
OTHER = "other"
logger = logging.getLogger("producer.gateway.requests")
LIMITER = RateLimiter(burst=20, per_s=1.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("fleet:gateway_requests", "HTTP answers of the gateway, by "
                                "route, method and status", ["route", "method", "status"],
                                registry=self.registry)
        self.duration = Histogram("fleet:gateway_request_duration_seconds", "Arrival to the "
                                  "end of the answer (streams: their last event)",
                                  ["route", "method"], buckets=BUCKETS, registry=self.registry)
        self.in_flight = Gauge("fleet:gateway_requests_in_flight", "Requests being answered",
                               ["route"], registry=self.registry)
        self.streams_open = Gauge("fleet:gateway_streams_open", "Event-stream answers being "
                                  "sent", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def route_of(scope: Scope) -> str:
    """The path template of the route ``scope`` matches (``other`` if none)."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return getattr(route, "path", OTHER)
    return OTHER


class MetricsMiddleware:
    """Counts and times every HTTP request of the app it wraps (outermost middleware)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, method = route_of(scope), scope.get("method", "GET")
        status = 500  # unless the app answers
        started = time.perf_counter()
        logged = streaming = False

        async def counting_send(message: Message) -> None:
            nonlocal status, logged, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                streaming = _is_stream(message)
                if streaming:
                    self.metrics.streams_open.inc()
            elif message["type"] == "http.response.body" and status >= 400 and not logged:
                logged = True
                _log_error(route, method, status, message.get("body", b""))
            await send(message)

        gauge = self.metrics.in_flight.labels(route)
        gauge.inc()
        try:
            await self.app(scope, receive, counting_send)
        finally:
            gauge.dec()
            if streaming:
                self.metrics.streams_open.dec()
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.duration.labels(route, method).observe(time.perf_counter() - started)


def _is_stream(start: Message) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
               for k, v in start.get("headers", ()))


def _log_error(route: str, method: str, status: int, body: bytes) -> None:
    try:
        code = json.loads(body)["error"]["code"]
    except Exception:  # noqa: BLE001 - not an OpenAI-shaped body: no code
        code = None
    level = logging.WARNING if status >= 500 else logging.INFO
    LIMITER.log(logger, level, f"{status // 100}xx", "request failed: %s %s -> %d %s", method,
                route, status, code or "", route=route, method=method, status=status, code=code)


async def metrics_endpoint(request: HttpRequest) -> Response:
    """``GET /metrics``: no API key needed (scrapers carry none); keep it off the public
    ingress if the route and status counts are not for everyone."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
