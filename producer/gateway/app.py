"""The ASGI app: routes, authentication, and the flow of one completion call."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from producer.client import AsyncFleetClient
from producer.gateway import schemas, translate
from producer.gateway.admission import Admission
from producer.gateway.errors import GatewayError, from_validation, invalid
from producer.gateway.options import GatewayOptions
from producer.gateway.render import Renderer, TokenNames
from producer.gateway.serve import Call, ClientGone
from shared import keys

logger = logging.getLogger(__name__)
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Gateway:
    """State shared by all calls: one Redis pool, one fleet client per served namespace."""

    def __init__(self, options: GatewayOptions) -> None:
        self.options = options
        self.names = TokenNames(options.tokenizer)
        self.redis = aioredis.from_url(options.redis_url)
        self.admission = Admission(self.redis, options)
        self.clients = {ns: AsyncFleetClient(options.redis_url, model=ns)
                        for ns in set(options.models.values())}
        self.background: set[asyncio.Task] = set()

    async def close(self) -> None:
        if self.background:
            await asyncio.wait(self.background, timeout=10)
        for client in self.clients.values():
            await client.close()
        await self.redis.aclose()

    def tenant(self, request: HttpRequest) -> str:
        if not self.options.api_keys:
            return "default"
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        tenant = self.options.api_keys.get(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise GatewayError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                               code="invalid_api_key")
        return tenant

    def namespace(self, model: str) -> str:
        if model not in self.options.models:
            raise GatewayError(404, f"the model {model!r} does not exist; served: "
                               f"{sorted(self.options.models)}", param="model",
                               code="model_not_found")
        return self.options.models[model]


async def _body(request: HttpRequest, limit: int) -> bytes:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise GatewayError(413, f"the request body exceeds {limit} bytes",
                               code="request_too_large")
    return body


async def _complete(request: HttpRequest, chat: bool) -> Response:
    gw: Gateway = request.app.state.gateway
    tenant = gw.tenant(request)
    req = schemas.decode(await _body(request, gw.options.max_body_bytes),
                         schemas.ChatRequest if chat else schemas.CompletionRequest)
    fields = (translate.chat_fields if chat else translate.completion_fields)(req, gw.options)
    namespace = gw.namespace(req.model)
    request_id = req.request_id or translate.new_id("chatcmpl" if chat else "cmpl")
    try:
        keys.request_tag(tenant, request_id)
    except ValueError:
        raise invalid("request_id may hold letters, digits and ._:- only (at most 128)",
                      param="request_id") from None
    client = gw.clients[namespace]
    try:
        request_obj = client.make_request(request_id=request_id, tenant=tenant, **fields)
    except msgspec.ValidationError as exc:
        raise from_validation(exc) from None
    await gw.admission.check_queue(namespace)
    await gw.admission.acquire(tenant, request_id)
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    renderer = Renderer(chat=chat, response_id=request_id, model=req.model, names=gw.names,
                        logprobs=request_obj.logprobs is not None, include_usage=include_usage)
    try:
        stream = await client.submit(request_obj)
    except BaseException:
        await gw.admission.release(tenant, request_id)
        raise
    call = Call(client=client, admission=gw.admission, stream=stream, tenant=tenant,
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
    """Ready when Redis answers. Workers are reported, not required: the queue holds
    requests until a worker (perhaps scaled from zero) takes them."""
    gw: Gateway = request.app.state.gateway
    try:
        await gw.redis.ping()
        depth = {m: await gw.admission.queue_depth(ns) for m, ns in gw.options.models.items()}
        workers = {m: await gw.redis.zcard(keys.workers_key(ns))
                   for m, ns in gw.options.models.items()}
    except (RedisError, OSError) as exc:
        return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready", "queued": depth, "workers": workers})


async def _gateway_error(request: HttpRequest, exc: GatewayError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _client_gone(request: HttpRequest, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it; the request was cancelled


async def _redis_down(request: HttpRequest, exc: Exception) -> Response:
    logger.warning("redis unavailable: %s", exc)
    error = GatewayError(503, "the fleet's queue is unavailable; retry later", type="server_error",
                         code="queue_unavailable", headers={"Retry-After": "1"})
    return await _gateway_error(request, error)


def create_app(options: GatewayOptions) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        app.state.gateway = Gateway(options)
        app.state.started = int(time.time())
        logger.info("gateway serving %s from %s", sorted(options.models), options.redis_url)
        yield
        await app.state.gateway.close()

    routes = [Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/ready", ready, methods=["GET"])]
    handlers = {GatewayError: _gateway_error, ClientGone: _client_gone,
                RedisConnectionError: _redis_down, RedisTimeoutError: _redis_down}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
