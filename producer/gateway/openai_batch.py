"""OpenAI Batch API lines <-> fleet requests, in one place for ``fleet batch`` and the gateway.

An input line is ``{"custom_id", "method": "POST", "url", "body"}`` with ``url``
``/v1/chat/completions`` or ``/v1/completions`` and ``body`` that endpoint's request (the
format vLLM's ``run-batch`` and OpenAI's ``/v1/batches`` take). An output line is
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``: the
body is the endpoint's whole response, or its OpenAI error object for a line that failed;
``error`` is set only for a line that never got a response (cancelled, expired).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import msgspec

from producer.errors import RequestFailed
from producer.gateway.schemas import ChatRequest, CompletionRequest, decode
from producer.gateway.errors import GatewayError, from_failure, invalid
from producer.gateway.options import GatewayOptions
from producer.gateway.render import Renderer, TokenNames
from producer.gateway.tools import forced_tool
from producer.gateway.translate import chat_fields, completion_fields

ENDPOINTS = {"/v1/chat/completions": True, "/v1/completions": False}  # url -> is chat
_BATCH_OPTIONS = GatewayOptions(redis_url="", lane="batch")


def digest(*parts: str, size: int = 24) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()[:size]


def is_openai_line(obj: Any) -> bool:
    """True for a line in the OpenAI Batch input format (how a file's format is told)."""
    return isinstance(obj, dict) and "custom_id" in obj and "body" in obj


@dataclass
class BatchLine:
    """One parsed input line: what to submit and how to render its answer."""

    custom_id: str
    url: str
    model: str
    fields: dict[str, Any]
    tool: str | None = None  # a forced tool call: answered as tool_calls

    @property
    def chat(self) -> bool:
        return ENDPOINTS[self.url]


def custom_id_of(obj: Any) -> str | None:
    value = obj.get("custom_id") if isinstance(obj, dict) else None
    return value if isinstance(value, str) and value else None


def parse(obj: Any, options: GatewayOptions = _BATCH_OPTIONS) -> BatchLine:
    """A decoded input line as fleet request fields; a :class:`GatewayError` (its status
    and OpenAI error body go into the output line) where the line is not a valid request."""
    custom_id = custom_id_of(obj)
    if custom_id is None:
        raise invalid("each line needs a non-empty string custom_id", param="custom_id")
    if obj.get("method", "POST") != "POST":
        raise invalid("method must be POST", param="method")
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise invalid(f"url must be one of {sorted(ENDPOINTS)}", param="url",
                      code="invalid_url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise invalid("body must be a JSON object", param="body")
    chat = ENDPOINTS[url]
    req = decode(msgspec.json.encode(body), ChatRequest if chat else CompletionRequest)
    if req.stream:
        raise invalid("stream is not supported in a batch", param="body.stream",
                      code="unsupported_value")
    fields = (chat_fields if chat else completion_fields)(req, options)
    fields["priority"] = "batch"
    fields["deadline"] = None  # a batch line may wait behind interactive lanes for hours
    return BatchLine(custom_id=custom_id, url=url, model=req.model, fields=fields,
                     tool=forced_tool(req) if chat else None)


def response_line(custom_id: str, request_id: str | None, status: int, body: Any) -> dict:
    return {"id": "batch_req_" + digest(custom_id, request_id or ""), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None}


def error_line(custom_id: str, code: str, message: str) -> dict:
    """A line that got no response at all (cancelled or expired before it ran)."""
    return {"id": "batch_req_" + digest(custom_id, code), "custom_id": custom_id,
            "response": None, "error": {"code": code, "message": message}}


def refused_line(custom_id: str, exc: GatewayError) -> dict:
    return response_line(custom_id, None, exc.status, exc.body())


def is_success(line: dict) -> bool:
    response = line.get("response")
    return bool(response) and response.get("status_code") == 200


async def run_line(client, line: BatchLine, request_id: str, names: TokenNames) -> dict:
    """Submit ``line`` as ``request_id`` through the fleet ``client``, wait, and return its
    output line (a fleet failure becomes the error the endpoint would have answered)."""
    request = client.make_request(request_id=request_id, **line.fields)
    stream = await client.submit(request)
    try:
        result = await stream.result()
    except RequestFailed as exc:
        return refused_line(line.custom_id, from_failure(exc.failure))
    if result.finish_reason == "cancelled":
        return error_line(line.custom_id, "batch_cancelled", "the request was cancelled")
    logprobs = request.logprobs is not None
    tokens = await client.get_progress(request_id, request.tenant) if logprobs else []
    renderer = Renderer(chat=line.chat, response_id=request_id, model=line.model, names=names,
                        logprobs=logprobs, tool=line.tool)
    return response_line(line.custom_id, request_id, 200, renderer.response(result, tokens))


def dumps(line: dict) -> str:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))
