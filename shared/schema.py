"""JSON Schema of the protocol. ``python -m shared.schema > docs/protocol.schema.json``."""
from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from shared.protocol import Cancel, Event, Request


def protocol_schema() -> dict[str, Any]:
    """One document: ``$defs`` for every type, ``Request`` (inbound) and ``Event`` (outbound)."""
    (request_ref, event_ref, cancel_ref), defs = msgspec.json.schema_components(
        [Request, Event, Cancel])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "fleet protocol",
        "description": "Request: the JSON in a stream entry's `data` field. Event: what is "
                       "published on a request's channel and stored as its progress/result. "
                       "Cancel: the notice on a model's control channel.",
        "$defs": {**defs, "Event": event_ref},
        "oneOf": [request_ref, {"$ref": "#/$defs/Event"}, cancel_ref],
    }


def render() -> str:
    return json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
