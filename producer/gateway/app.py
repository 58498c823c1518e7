"""The ASGI app: routes, authentication, and the flow of one completion call."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from producer.client import AsyncFleetClient, encode_request
from producer.errors import PayloadTooLarge
from producer.gateway import batches, errors, schemas, translate
from producer.gateway.handlers import EXCEPTION_HANDLERS, Guard
from producer.gateway.metrics import GatewayMetrics, MetricsMiddleware, metrics_endpoint
from producer.gateway.options import GatewayOptions
from producer.gateway.redact import redact
from producer.gateway.render import Renderer
from producer.gateway.serve import Call
from producer.gateway.state import Gateway
from producer.gateway.tools import forced_tool
from producer.stats_log import GatewayStats
from shared import keys
from shared.protocol import Request

logger = logging.getLogger(__name__)
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _body(request: HttpRequest, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit``: from its declared
    length when it has one, else once that much has arrived."""
    message = (f"the request body is over {limit} bytes, the largest request the fleet "
               "accepts")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise errors.too_large(message)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise errors.too_large(message)
    return bytes(body)


def _fleet_request(client: AsyncFleetClient, fields: dict[str, Any],
                   request_id: str, tenant: str) -> Request:
    """The fleet request, checked as the worker will check it, so that nothing is enqueued
    (and no quota slot taken) that the fleet would refuse unread."""
    try:
        keys.request_tag(tenant, request_id)
    except ValueError:
        raise errors.invalid("request_id may hold letters, digits and ._:- only (at most "
                             "128)", param="request_id") from None
    try:
        request_obj = client.make_request(request_id=request_id, tenant=tenant, **fields)
    except msgspec.ValidationError as exc:
        raise errors.from_validation(exc) from None
    try:
        encode_request(request_obj)
    except PayloadTooLarge as exc:
        raise errors.too_large(str(exc)) from None
    return request_obj


async def _complete(request: HttpRequest, chat: bool) -> Response:
    gw: Gateway = request.app.state.gateway
    tenant = gw.tenant(request)
    req = schemas.decode(await _body(request, gw.options.max_body_bytes),
                         schemas.ChatRequest if chat else schemas.CompletionRequest)
    fields = (translate.chat_fields if chat else translate.completion_fields)(req, gw.options)
    namespace = gw.namespace(req.model)
    client = gw.client(namespace, tenant)
    request_id = req.request_id or translate.new_id("chatcmpl" if chat else "cmpl")
    request_obj = _fleet_request(client, fields, request_id, tenant)
    await gw.redis_step(gw.admit(tenant))
    admission = await gw.redis_step(gw.admission())
    await gw.redis_step(admission.check_queue(namespace, tenant))
    await gw.redis_step(gw.connected(client))
    await gw.redis_step(admission.acquire(tenant, request_id))
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    renderer = Renderer(chat=chat, response_id=request_id, model=req.model, names=gw.names,
                        logprobs=request_obj.logprobs is not None, include_usage=include_usage,
                        tool=forced_tool(req) if chat else None)
    try:
        stream = await gw.redis_step(client.submit(request_obj))
    except BaseException:
        await admission.release(tenant, request_id)
        raise
    call = Call(client=client, admission=admission, stream=stream, tenant=tenant,
                renderer=renderer, timeout_s=gw.options.request_timeout_s + 30,
                background=gw.background)
    if not req.stream:
        return JSONResponse(await call.whole(request))
    it, first = await call.first(request)
    return StreamingResponse(call.events(it, first, include_usage),
                             media_type="text/event-stream", headers=_SSE_HEADERS)


async def chat_completions(request: HttpRequest) -> Response:
    return await _complete(request, chat=True)


async def completions(request: HttpRequest) -> Response:
    return await _complete(request, chat=False)


async def models(request: HttpRequest) -> Response:
    gw: Gateway = request.app.state.gateway
    gw.tenant(request)
    created = request.app.state.started
    data = [{"id": name, "object": "model", "created": created, "owned_by": "fleet"}
            for name in sorted(gw.options.models)]
    return JSONResponse({"object": "list", "data": data})


async def health(request: HttpRequest) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: HttpRequest) -> Response:
    """Ready when Redis answers and the queues can be read -- with exactly the commands
    enqueueing needs (the registry, each served tenant's stream of the lane), which the
    shipped ``fleet-gateway`` ACL user has, on one server or a cluster. ``queued`` sums the
    tenants of the configured keys. Workers are reported where readable, not required: the
    queue holds requests until a worker (perhaps scaled from zero) takes them. Not ready is
    a 503 with ``Retry-After``."""
    gw: Gateway = request.app.state.gateway
    redis = await gw.redis_step(gw.redis())
    await gw.redis_step(redis.ping())
    tenants = await gw.redis_step(gw.served_tenants())
    admission = await gw.redis_step(gw.admission())
    depth = {}
    for model, namespace in gw.options.models.items():
        depth[model] = 0
        for tenant in tenants:
            depth[model] += await gw.redis_step(admission.queue_depth(namespace, tenant))
    workers = {m: await gw.live_workers(ns) for m, ns in gw.options.models.items()}
    return JSONResponse({"status": "ready", "queued": depth, "workers": workers})


def create_app(options: GatewayOptions) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        app.state.gateway = Gateway(options)
        app.state.started = int(time.time())
        logger.info("gateway serving %s from %s", sorted(options.models),
                    redact(options.redis_url))
        batches.start_runner(app)  # /v1/files + /v1/batches: producer/gateway/batches.py
        stats = GatewayStats(app.state.metrics.registry, options.log_stats_interval_s,
                             batches_running=lambda: len(app.state.batch_runner.tasks)).start()
        yield
        stats.stop()
        await batches.stop_runner(app)
        await app.state.gateway.close()

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/ready", ready, methods=["GET"]),
              Route("/metrics", metrics_endpoint, methods=["GET"])]  # ops: gateway/metrics.py
    routes += batches.ROUTES
    metrics = GatewayMetrics()
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(MetricsMiddleware, metrics=metrics), Middleware(Guard)],
                    exception_handlers=EXCEPTION_HANDLERS)
    # A near-miss path is a 404 in the OpenAI shape, not an empty 307 to another URL (the
    # OpenAI API does not redirect either); Starlette offers no constructor flag for it.
    app.router.redirect_slashes = False
    app.state.metrics = metrics
    return app
