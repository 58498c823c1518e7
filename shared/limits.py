"""Bounds enforced when a request is decoded, before any worker spends work on it.

The engine applies its own, model-dependent bounds (``max_model_len``) afterwards.
"""
from __future__ import annotations

PROTOCOL_VERSION = 1

MAX_PAYLOAD_BYTES = 512 * 1024
MAX_PROMPT_CHARS = 200_000
MAX_PROMPT_TOKENS = 32_768
MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 100_000
MAX_TOKENS = 16_384
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20
MAX_N = 16  # samples (choices) of one request
MAX_METADATA_ITEMS = 32
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 1024
MAX_STRUCTURED_SPEC_CHARS = 64 * 1024  # a regex, an EBNF grammar, a JSON Schema (as compact JSON)
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024
MAX_TOKEN_ID = 2**31 - 1
MAX_TOP_K = 2**31 - 1  # beyond the vocabulary it means no top-k; bounded so every engine holds it
MAX_UNIX_TIME = 1e11  # deadlines and timestamps, seconds (year 5138)

# Ids become part of Redis key names, so they are restricted to a safe alphabet: no
# braces (hash tags), no spaces, no glob characters.
# ``(?!\n)``: Python's ``$`` also matches before a final newline, which must not reach a
# key name; JavaScript and JSON Schema validators read the same pattern alike.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$(?!\n)"
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$(?!\n)"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$(?!\n)"
MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer every JSON parser (JavaScript's) holds exactly

# Untrusted JSON is never nested deeper than this (a request needs 3 levels): deeper
# payloads are refused before any recursive decoder sees them.
MAX_JSON_DEPTH = 64
# How much of a payload the non-recursive scanner reads to find an id to answer.
MAX_SCAN_BYTES = 4 * 1024 * 1024
