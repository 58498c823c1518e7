"""What a request asks its output to match, as a hashable value (the compile cache's key)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from gpu_worker.errors import InvalidRequestError
from shared import limits as L
from shared.errors import INVALID_GRAMMAR

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredSpec:
    """``kind`` is one of :data:`KINDS`; ``spec`` its text: canonical JSON of the schema,
    the regex, a JSON list of the choices, the EBNF grammar ("" for ``json_object``)."""

    kind: str
    spec: str = ""

    @classmethod
    def json_schema(cls, schema: dict) -> StructuredSpec:
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredSpec:
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))

    def validate(self) -> None:
        """Raise ``invalid_grammar`` for what can never compile, before anything is queued."""
        if self.kind not in KINDS:
            raise InvalidRequestError(INVALID_GRAMMAR, f"structured kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.spec, str) or len(self.spec) > L.MAX_STRUCTURED_SPEC_CHARS:
            raise InvalidRequestError(INVALID_GRAMMAR, f"the {self.kind} spec must be a string of at most "
                                      f"{L.MAX_STRUCTURED_SPEC_CHARS} characters")
        if self.kind in ("regex", "grammar") and not self.spec:
            raise InvalidRequestError(INVALID_GRAMMAR, f"the {self.kind} spec is empty")
        if self.kind == "choice":
            choices = _json(self.spec)
            if not (isinstance(choices, list) and 0 < len(choices) <= L.MAX_CHOICES
                    and all(isinstance(c, str) and 0 < len(c) <= L.MAX_CHOICE_CHARS for c in choices)):
                raise InvalidRequestError(INVALID_GRAMMAR, f"choice needs 1..{L.MAX_CHOICES} strings of 1..{L.MAX_CHOICE_CHARS} characters")
        if self.kind == "json_schema" and not isinstance(_json(self.spec), dict):
            raise InvalidRequestError(INVALID_GRAMMAR, "a JSON Schema must be a JSON object")


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(INVALID_GRAMMAR, f"not JSON: {exc}") from None


def from_wire(structured) -> StructuredSpec | None:
    """The spec of a wire :class:`shared.protocol.Request`'s ``structured`` field (None: none)."""
    if structured is None:
        return None
    kind = type(structured).__struct_config__.tag   # msgspec's tag: the wire `type`
    if kind == "json_schema":
        return StructuredSpec.json_schema(structured.schema)
    if kind == "regex":
        return StructuredSpec(kind, structured.pattern)
    if kind == "choice":
        return StructuredSpec.choice(structured.choices)
    if kind == "grammar":
        return StructuredSpec(kind, structured.ebnf)
    return StructuredSpec("json_object")
