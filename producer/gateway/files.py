"""``/v1/files``: upload (multipart, ``purpose=batch``), list, retrieve, content, delete.

Files belong to the caller's tenant (its API key) and live in Redis
(:mod:`producer.gateway.batch_store`); another tenant's id is a 404. Uploads are JSONL
kept line by line; ``expires_after[seconds]`` shortens the default 30 days.
"""
from __future__ import annotations

import email.parser
import email.policy
import time

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from producer.gateway import errors
from producer.gateway.batch_store import FILE_TTL_S, Store, new_id, valid_id
from producer.gateway.state import Gateway

MAX_UPLOAD_BYTES = 200 * 2 ** 20  # OpenAI's limit for a batch input file
PURPOSES = {"batch", "batch_output"}


async def context(request: HttpRequest) -> tuple[Gateway, str, Store]:
    """The gateway, the caller's tenant (401/403 as for completions) and the store."""
    gw: Gateway = request.app.state.gateway
    tenant = gw.tenant(request)
    redis = await gw.redis_step(gw.redis())
    await gw.redis_step(gw.registry.admit(redis, tenant, "batch"))
    if not hasattr(request.app.state, "batch_store"):
        request.app.state.batch_store = Store(redis)
    return gw, tenant, request.app.state.batch_store


def _form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Multipart form fields: name -> (filename, value)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise errors.invalid("upload a file as multipart/form-data", code="invalid_content_type")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        raise errors.invalid("the multipart body could not be read", code="invalid_multipart")
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


def _ttl(fields: dict) -> int:
    raw = fields.get("expires_after[seconds]", (None, b""))[1].decode() or str(FILE_TTL_S)
    if not raw.isdigit() or not 3600 <= int(raw) <= FILE_TTL_S:
        raise errors.invalid(f"expires_after[seconds] must be 3600 to {FILE_TTL_S}",
                             param="expires_after")
    return int(raw)


async def create(request: HttpRequest) -> Response:
    gw, tenant, store = await context(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES:
        raise errors.too_large(f"a file may hold at most {MAX_UPLOAD_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_UPLOAD_BYTES:
            raise errors.too_large(f"a file may hold at most {MAX_UPLOAD_BYTES} bytes")
    fields = _form(request.headers.get("content-type", ""), bytes(body))
    purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
    if purpose != "batch":
        raise errors.invalid("only purpose 'batch' is supported", param="purpose")
    if "file" not in fields:
        raise errors.invalid("'file' is a required property", param="file",
                             code="missing_required_parameter")
    filename, content = fields["file"]
    lines = [line for line in content.splitlines() if line.strip()]
    now = int(time.time())
    ttl_s = _ttl(fields)
    meta = {"id": new_id("file"), "object": "file", "bytes": len(content), "created_at": now,
            "filename": filename or "upload.jsonl", "purpose": purpose, "status": "processed",
            "expires_at": now + ttl_s, "status_details": None}
    return JSONResponse(await gw.redis_step(store.put_file(tenant, meta, lines, ttl_s)))


async def _meta(request: HttpRequest) -> tuple[Gateway, str, Store, dict]:
    gw, tenant, store = await context(request)
    file_id = request.path_params["file_id"]
    meta = await gw.redis_step(store.file(tenant, file_id)) if valid_id(file_id, "file") else None
    if meta is None:
        raise errors.GatewayError(404, f"no such file: {file_id[:80]!r}", param="file_id",
                                  code="file_not_found")
    return gw, tenant, store, meta


async def retrieve(request: HttpRequest) -> Response:
    return JSONResponse((await _meta(request))[3])


async def listing(request: HttpRequest) -> Response:
    gw, tenant, store = await context(request)
    files = await gw.redis_step(store.files(tenant))
    purpose = request.query_params.get("purpose")
    data = [f for f in files if purpose is None or f["purpose"] == purpose]
    if request.query_params.get("order", "desc") == "desc":
        data.reverse()
    return JSONResponse({"object": "list", "data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})


async def content(request: HttpRequest) -> Response:
    gw, tenant, store, meta = await _meta(request)

    async def body():
        async for chunk in store.lines(tenant, meta["id"]):
            yield b"".join(line + b"\n" for line in chunk)

    return StreamingResponse(body(), media_type="application/jsonl")


async def delete(request: HttpRequest) -> Response:
    gw, tenant, store, meta = await _meta(request)
    await gw.redis_step(store.delete_file(tenant, meta["id"]))
    return JSONResponse({"id": meta["id"], "object": "file", "deleted": True})


ROUTES = [Route("/v1/files", create, methods=["POST"]),
          Route("/v1/files", listing, methods=["GET"]),
          Route("/v1/files/{file_id}", retrieve, methods=["GET"]),
          Route("/v1/files/{file_id}", delete, methods=["DELETE"]),
          Route("/v1/files/{file_id}/content", content, methods=["GET"])]
