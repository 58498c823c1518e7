"""Structured outputs: a request's output constrained by a grammar (xgrammar).

``spec`` says what a request asks for (:class:`StructuredSpec`: JSON object, JSON Schema,
regex, a choice of strings, EBNF); ``compiler`` compiles it off the engine thread, cached
per (kind, spec); ``state`` is one request's matcher (fed every output token, rolled back
after a draft check); ``masks`` turns the matchers of a batch's rows into one token bitmask
applied to the logits of the constrained rows only.
"""
from gpu_worker.structured.spec import KINDS, StructuredSpec, from_wire

__all__ = ["KINDS", "StructuredSpec", "from_wire"]
