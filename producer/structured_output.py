"""OpenAI's ``response_format`` as the fleet's ``structured`` request field."""
from __future__ import annotations

from typing import Any


class UnsupportedFormat(ValueError):
    """A ``response_format`` the fleet cannot honour; ``param`` names the offending part."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


def from_response_format(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{"type": "text"}`` (or None) -> None; ``json_object`` -> a JSON object;
    ``json_schema`` -> that schema (``strict`` or not: the output is always constrained)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise UnsupportedFormat("response_format must be an object")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise UnsupportedFormat(f"response_format type {kind!r} is not supported "
                                "(text, json_object, json_schema)", "response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise UnsupportedFormat("json_schema must be an object with a `schema` object",
                                "response_format.json_schema")
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False), (bool, type(None))):
        raise UnsupportedFormat("json_schema.name must be a string and strict a boolean",
                                "response_format.json_schema")
    schema = spec.get("schema")
    return {"type": "json_object"} if not schema else {"type": "json_schema", "schema": schema}


def for_function(parameters: Any) -> dict[str, Any]:
    """The ``structured`` field that constrains output to a function's ``parameters``."""
    if parameters is None or parameters == {}:
        return {"type": "json_object"}
    if not isinstance(parameters, dict):
        raise UnsupportedFormat("a function's parameters must be a JSON Schema object", "tools")
    return {"type": "json_schema", "schema": parameters}
