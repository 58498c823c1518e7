"""The two sides the schema tests compare: the published JSON Schema and the decoder."""
from __future__ import annotations

import json

import jsonschema

from shared import codec, errors
from shared.schema import protocol_schema


def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of one ``$defs`` entry of the published schema (e.g. ``Request``)."""
    schema = protocol_schema()
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": schema["$defs"]})


def decoder_accepts(payload) -> bool:
    """True when the worker's decoder takes ``payload`` (as JSON) as a request."""
    try:
        codec.decode_request(json.dumps(payload).encode())
    except errors.ProtocolError:
        return False
    return True
