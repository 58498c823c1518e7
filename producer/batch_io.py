"""The files of ``fleet batch``: input lines as jobs (either format, read lazily), what the
output already holds (to resume), and the writer (completion or input order)."""
from __future__ import annotations

import collections
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import msgspec

from producer.gateway import openai_batch
from producer.gateway.errors import GatewayError, invalid
from shared.protocol import Request

FLEET, OPENAI = "fleet", "openai"


class BadOutput(ValueError):
    """The output file holds a line that is not one of ours (it is never overwritten)."""


@dataclass
class Job:
    """One input line: ``key`` is what its output line is found by on a rerun."""

    number: int
    key: str
    request: Request | None = None  # fleet format
    line: openai_batch.BatchLine | None = None  # OpenAI format
    request_id: str | None = None
    refused: GatewayError | None = None  # OpenAI format, not a valid request


def detect_format(path: str) -> str:
    """OpenAI Batch when the first non-empty line has ``custom_id`` and ``body``."""
    with open(path, encoding="utf-8") as f:
        for text in f:
            if text.strip():
                try:
                    return OPENAI if openai_batch.is_openai_line(json.loads(text)) else FLEET
                except ValueError:
                    return FLEET
    return FLEET


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def line_request(line: str, *, tenant: str, lane: str) -> Request:
    """A fleet-format line; without ``request_id`` its id is a digest of the line alone, so
    inserting or removing other lines changes no id."""
    fields = json.loads(line)
    if not isinstance(fields, dict):
        raise ValueError("each line must be a JSON object")
    digest = hashlib.sha256(line.strip().encode()).hexdigest()[:20]
    fields.setdefault("request_id", f"batch-{digest}")
    fields.setdefault("tenant", tenant)
    fields.setdefault("priority", lane)
    fields.setdefault("submitted_at", time.time())
    return msgspec.convert(fields, Request)


def _openai_job(number: int, text: str) -> Job:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return Job(number, f"line-{number}", refused=invalid(
            f"line {number} is not JSON: {exc}", code="invalid_json"))
    key = openai_batch.custom_id_of(obj) or f"line-{number}"
    try:
        line = openai_batch.parse(obj)
    except GatewayError as exc:
        return Job(number, key, refused=exc)
    request_id = "ob-" + openai_batch.digest(line.custom_id, json.dumps(obj.get("body"),
                                                                         sort_keys=True))
    return Job(number, key, line=line, request_id=request_id)


def jobs(path: str, fmt: str, *, tenant: str, lane: str, errors: list) -> Iterator[Job]:
    """The file's jobs, one line at a time; fleet-format lines that are not requests are
    appended to ``errors`` as ``(number, message)`` and skipped."""
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            if fmt == OPENAI:
                yield _openai_job(number, text)
                continue
            try:
                request = line_request(text, tenant=tenant, lane=lane)
            except (ValueError, msgspec.ValidationError) as exc:
                errors.append((number, str(exc)))
                continue
            yield Job(number, request.request_id, request=request,
                      request_id=request.request_id)


def finished(path: str) -> collections.Counter:
    """How often each key (request id, or custom id) is in the output already; a torn last
    line (an interrupted write) is cut off."""
    done: collections.Counter = collections.Counter()
    if not os.path.exists(path):
        return done
    with open(path, "rb+") as f:
        keep = 0  # bytes of whole lines
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            keep += len(raw)
            if raw.strip():
                try:
                    row = json.loads(raw)
                    done[row.get("custom_id") or row.get("request_id")] += 1
                except (ValueError, AttributeError):
                    raise BadOutput(f"{path} holds a line that is not an output line: "
                                    f"{raw[:80]!r}; name another output file") from None
        f.truncate(keep)
    return done


class Writer:
    """Writes output lines as they complete, or (``ordered``) in input order, holding
    those that complete early; ``on_written`` runs once per line written."""

    def __init__(self, out: TextIO, ordered: bool, on_written) -> None:
        self.out, self.ordered, self.on_written = out, ordered, on_written
        self._next = 0
        self._held: dict[int, str] = {}

    def put(self, seq: int, record: dict[str, Any]) -> None:
        text = json.dumps(record, ensure_ascii=False) + "\n"
        if not self.ordered:
            self._write(text)
            return
        self._held[seq] = text
        while self._next in self._held:
            self._write(self._held.pop(self._next))
            self._next += 1

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.on_written()
