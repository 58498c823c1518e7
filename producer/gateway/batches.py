"""``/v1/batches``: create, retrieve, list, cancel. The lines run in the gateway's
background runner (:mod:`producer.gateway.batch_runner`) on the fleet's ``batch`` lane."""
from __future__ import annotations

import re
import time
import uuid

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from producer.gateway import errors, files
from producer.gateway.batch_store import OPEN, new_id, render, valid_id
from producer.gateway.openai_batch import ENDPOINTS
from shared import limits as L

_WINDOW_RE = re.compile(r"^([1-9][0-9]{0,3})h$")


class CreateBatch(msgspec.Struct, kw_only=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def _file_id(batch_id: str) -> str:
    return "file-" + uuid.uuid5(uuid.NAMESPACE_URL, batch_id).hex


async def create(request: HttpRequest) -> Response:
    gw, tenant, store = await files.context(request)
    body = await request.body()
    if len(body) > 64 * 1024:
        raise errors.too_large("a batch request body holds at most 64 KiB")
    try:
        req = msgspec.json.decode(body, type=CreateBatch)
    except msgspec.MsgspecError as exc:
        raise errors.from_validation(exc) from None
    if req.endpoint not in ENDPOINTS:
        raise errors.invalid(f"endpoint must be one of {sorted(ENDPOINTS)}", param="endpoint",
                             code="invalid_value")
    window = _WINDOW_RE.match(req.completion_window)
    if window is None:
        raise errors.invalid("completion_window must be hours, as '24h'",
                             param="completion_window", code="invalid_value")
    if req.metadata and (len(req.metadata) > 16 or any(
            len(k) > 64 or len(v) > L.MAX_METADATA_VALUE_CHARS for k, v in req.metadata.items())):
        raise errors.invalid("metadata holds at most 16 pairs, keys of at most 64 characters",
                             param="metadata")
    source = await gw.redis_step(store.file(tenant, req.input_file_id)) \
        if valid_id(req.input_file_id, "file") else None
    if source is None or source["purpose"] != "batch":
        raise errors.GatewayError(404, f"no batch input file {req.input_file_id[:80]!r}",
                                  param="input_file_id", code="file_not_found")
    batch_id, now = new_id("batch"), int(time.time())
    fixed = {"id": batch_id, "endpoint": req.endpoint, "input_file_id": req.input_file_id,
             "completion_window": req.completion_window, "created_at": now,
             "expires_at": now + 3600 * int(window.group(1)), "metadata": req.metadata,
             "output_file_id": _file_id(batch_id + "/output"),
             "error_file_id": _file_id(batch_id + "/errors")}
    await gw.redis_step(store.put_batch(tenant, fixed))
    request.app.state.batch_runner.wake()
    return JSONResponse(render(await gw.redis_step(store.batch(tenant, batch_id))))


async def _state(request: HttpRequest):
    gw, tenant, store = await files.context(request)
    batch_id = request.path_params["batch_id"]
    state = await gw.redis_step(store.batch(tenant, batch_id)) \
        if valid_id(batch_id, "batch") else None
    if state is None:
        raise errors.GatewayError(404, f"no such batch: {batch_id[:80]!r}", param="batch_id",
                                  code="batch_not_found")
    return gw, tenant, store, batch_id, state


async def retrieve(request: HttpRequest) -> Response:
    return JSONResponse(render((await _state(request))[4]))


async def cancel(request: HttpRequest) -> Response:
    gw, tenant, store, batch_id, _ = await _state(request)
    moved, found = await gw.redis_step(store.move(tenant, batch_id, "cancelling", OPEN))
    if moved:
        request.app.state.batch_runner.wake()
    elif not found:
        raise errors.GatewayError(404, f"no such batch: {batch_id}", param="batch_id",
                                  code="batch_not_found")
    elif found != "cancelling":  # finalizing or over (checked and set in one step)
        raise errors.GatewayError(409, f"the batch is {found}; it cannot be cancelled",
                                  code="batch_not_cancellable")
    return JSONResponse(render(await gw.redis_step(store.batch(tenant, batch_id))))


async def listing(request: HttpRequest) -> Response:
    gw, tenant, store = await files.context(request)
    ids = await gw.redis_step(store.batch_ids(tenant))
    after = request.query_params.get("after")
    if after in ids:
        ids = ids[ids.index(after) + 1:]
    limit = request.query_params.get("limit", "20")
    limit = min(max(int(limit), 1), 100) if limit.isdigit() else 20
    data = []
    for batch_id in ids[:limit]:
        state = await gw.redis_step(store.batch(tenant, batch_id))
        if state is not None:
            data.append(render(state))
    return JSONResponse({"object": "list", "data": data, "has_more": len(ids) > limit,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})


ROUTES = [*files.ROUTES,
          Route("/v1/batches", create, methods=["POST"]),
          Route("/v1/batches", listing, methods=["GET"]),
          Route("/v1/batches/{batch_id}", retrieve, methods=["GET"]),
          Route("/v1/batches/{batch_id}/cancel", cancel, methods=["POST"])]


def start_runner(app) -> None:
    """At gateway start: the runner that resumes every unfinished batch."""
    from producer.gateway.batch_runner import BatchRunner

    app.state.batch_runner = BatchRunner(app.state.gateway).start()


async def stop_runner(app) -> None:
    await app.state.batch_runner.stop()
