"""Structured outputs at the gateway: ``response_format`` and a forced tool call.

``tools`` with ``tool_choice`` naming one function (or ``"required"`` with one tool)
constrains the output to that function's ``parameters`` and answers it as the message's
``tool_calls`` (finish reason ``tool_calls``); ``tool_choice: "none"`` generates text as
if there were no tools. ``"auto"`` (the model deciding whether to call) is refused.
"""
from __future__ import annotations

import uuid
from typing import Any

from producer.gateway.errors import invalid
from producer.structured_output import UnsupportedFormat, for_function, from_response_format


def structured_field(req) -> dict[str, Any] | None:
    """The fleet ``structured`` field of a chat request (None: free text); 400 if unsupported."""
    try:
        tool = _forced(req)
        if tool is not None:
            if req.response_format and req.response_format.get("type", "text") != "text":
                raise UnsupportedFormat("response_format cannot be combined with a forced tool call")
            return for_function(tool.get("parameters"))
        return from_response_format(req.response_format)
    except UnsupportedFormat as exc:
        raise invalid(str(exc), param=exc.param, code="unsupported_value") from None


def forced_tool(req) -> str | None:
    """The name of the function a chat request forces, or None."""
    tool = _forced(req)
    return None if tool is None else tool["name"]


def _forced(req) -> dict | None:
    if not req.tools:
        return None
    functions = [t.get("function") for t in req.tools if isinstance(t, dict) and t.get("type") == "function"]
    if len(functions) != len(req.tools) or not all(isinstance(f, dict) and isinstance(f.get("name"), str)
                                                   for f in functions):
        raise UnsupportedFormat("every tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tools")
    choice = req.tool_choice
    if choice == "none":
        return None
    if choice == "required" and len(functions) == 1:
        return functions[0]
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        for f in functions:
            if f["name"] == name:
                return f
        raise UnsupportedFormat(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    raise UnsupportedFormat("tools need tool_choice forcing one function ({\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}, or \"required\" with one tool) or \"none\"; "
                            "\"auto\" is not supported", "tool_choice")


def tool_calls(name: str, arguments: str, call_id: str, *, delta: bool = False, first: bool = True) -> list[dict]:
    """OpenAI ``tool_calls`` of one call: whole, or a stream delta (the first names it)."""
    if delta and not first:
        return [{"index": 0, "function": {"arguments": arguments}}]
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [{"index": 0, **call}] if delta else [call]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def as_tool_call(choice: dict, name: str, call_id: str, opened: set[int], *, chunk: bool) -> None:
    """Turn a rendered chat choice's text into the forced call's ``arguments`` (in place)."""
    index = choice["index"]
    call_id = call_id if index == 0 else f"{call_id}_{index}"
    if chunk:
        delta = choice["delta"]
        if "content" in delta:
            text = delta.pop("content")
            delta["tool_calls"] = tool_calls(name, text, call_id, delta=True, first=index not in opened)
            opened.add(index)
    else:
        message = choice["message"]
        message["tool_calls"] = tool_calls(name, message["content"] or "", call_id)
        message["content"] = None
    if choice["finish_reason"] == "stop":
        choice["finish_reason"] = "tool_calls"
