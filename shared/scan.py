"""A bounded, non-recursive look at an untrusted JSON payload.

Used before (and instead of) a full decode where a full decode is unsafe or has failed:
to measure nesting depth without recursing, and to read the top-level ``request_id``,
``tenant`` and ``v`` of a payload that is malformed, too deep or too large, so its client
can still be sent a typed failure. Strings are matched by the regex engine in C, so the
Python loop runs once per string or bracket, never once per byte; at most
``limits.MAX_SCAN_BYTES`` are looked at.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from shared import limits as L

_NEXT = re.compile(rb'["\[\]{}]')  # where the next string or bracket starts
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_COLON = re.compile(rb"\s*:\s*")
_INT = re.compile(rb"-?\d{1,20}")
_ID_RE = re.compile(L.REQUEST_ID_PATTERN)
_TENANT_RE = re.compile(L.TENANT_PATTERN)
_WANTED = {b'"request_id"': "request_id", b'"tenant"': "tenant", b'"v"': "v"}


@dataclass(frozen=True)
class Scan:
    """What a scan found. ``too_deep``: nesting passed ``max_depth`` (the scan stopped
    there, so fields after that point are unknown). Ids are ``None`` unless they are
    top-level strings that match the protocol's patterns."""

    max_depth: int
    too_deep: bool
    request_id: str | None = None
    tenant: str | None = None
    version: int | None = None


def scan(raw: object, *, max_depth: int = L.MAX_JSON_DEPTH,
         limit: int = L.MAX_SCAN_BYTES) -> Scan:
    """Scan the first ``limit`` bytes of ``raw`` (anything but bytes finds nothing);
    never raises, never recurses."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        return Scan(0, False)
    head = bytes(raw[:limit])
    depth = deepest = 0
    found: dict[str, object] = {}
    pos = 0
    while (m := _NEXT.search(head, pos)) is not None:
        c = head[m.start()]
        pos = m.end()
        if c == 0x22:  # a string: skipped whole (an unterminated one ends the scan)
            string = _STRING.match(head, m.start())
            if string is None:
                break
            pos = string.end()
            if depth == 1 and string.group() in _WANTED:
                _read_value(head, pos, _WANTED[string.group()], found)
        elif c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > max_depth:
                    return _result(deepest, True, found)
        elif c in (0x5D, 0x7D):  # ] }
            depth = max(depth - 1, 0)
    return _result(deepest, False, found)


def _read_value(head: bytes, pos: int, name: str, found: dict) -> None:
    colon = _COLON.match(head, pos)
    if colon is None or name in found:
        return  # a value, not a key; or a repeated key (the first one counts, as msgspec's)
    pos = colon.end()
    if name == "v":
        num = _INT.match(head, pos)
        found[name] = int(num.group()) if num else None
        return
    string = _STRING.match(head, pos)
    if string is None or not string.group().startswith(b'"'):
        found[name] = None
        return
    try:
        found[name] = msgspec.json.decode(string.group(), type=str)
    except (msgspec.DecodeError, msgspec.ValidationError):
        found[name] = None


def _result(deepest: int, too_deep: bool, found: dict) -> Scan:
    request_id = found.get("request_id")
    tenant = found.get("tenant")  # absent or null: the stream names the tenant
    if not (isinstance(request_id, str) and _ID_RE.match(request_id)
            and (tenant is None or isinstance(tenant, str) and _TENANT_RE.match(tenant))):
        request_id = tenant = None
    version = found.get("v")
    return Scan(deepest, too_deep, request_id, tenant,
                version if isinstance(version, int) else None)
