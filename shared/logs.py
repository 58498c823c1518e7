"""Logging of every fleet process: text or JSON lines, a level, and rate-limited events.

:func:`configure` sets the root handler once per process (``--log-format text|json``,
``--log-level``; defaults from ``$LOG_FORMAT`` / ``$LOG_LEVEL``). JSON is one object per
line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, then the record's structured
fields (``extra={...}``: ``request_id``, ``tenant``, ``code``, ...), and ``exc`` for a
traceback. Text prints the same fields as ``key=value`` after the message (unless the record
sets ``_fields_in_msg``: its message already says them).

:class:`RateLimiter` keeps a flood of bad entries from flooding the log: per kind of line,
a bucket of ``burst`` lines refilled at ``per_s`` lines a second; lines over it are dropped
and counted, and the next line let through carries ``suppressed=<n>``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from datetime import datetime, timezone

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message",
                                                                          "asctime"}


def fields_of(record: logging.LogRecord) -> dict:
    """The structured fields a caller passed with ``extra=``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _iso(record.created), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        for key, value in fields_of(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if getattr(record, "_fields_in_msg", False):  # the message already says them all
            return line
        extra = " ".join(f"{k}={v}" for k, v in fields_of(record).items() if v is not None)
        if not extra:
            return line
        head, sep, tail = line.partition("\n")  # fields on the message's line, not after a traceback
        return f"{head} {extra}{sep}{tail}"


def configure(fmt: str | None = None, level: str | None = None, *, stream=None) -> None:
    """Route every logger of the process to one handler on ``stream`` (stderr). Called
    again, it replaces the handler it installed before and leaves others' alone (a test
    runner's capture, an embedding application's)."""
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "text").lower()
    level = (level or os.environ.get("LOG_LEVEL") or "info").upper()
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.fleet_handler = True
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "fleet_handler", False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn lines go through the same format


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level`` (defaults: ``$LOG_FORMAT``/``$LOG_LEVEL``)."""
    parser.add_argument("--log-format", choices=FORMATS,
                        default=(os.environ.get("LOG_FORMAT") or "text").lower(),
                        help="log lines as text or one JSON object per line ($LOG_FORMAT)")
    parser.add_argument("--log-level", type=str.lower, choices=LEVELS,
                        default=(os.environ.get("LOG_LEVEL") or "info").lower(),
                        help="the least severe level logged ($LOG_LEVEL)")


def configure_from(args: argparse.Namespace) -> None:
    configure(getattr(args, "log_format", None), getattr(args, "log_level", None))


class RateLimiter:
    """At most ``burst`` lines at once and ``per_s`` a second on average, per kind."""

    def __init__(self, burst: int = 20, per_s: float = 1.0, clock=time.monotonic) -> None:
        self.burst, self.per_s, self.clock = burst, per_s, clock
        self._buckets: dict[str, list[float]] = {}  # kind -> [tokens, last refill, suppressed]
        self._lock = threading.Lock()

    def allow(self, kind: str) -> int | None:
        """None: drop this line. Else the number of lines of ``kind`` dropped before it."""
        now = self.clock()
        with self._lock:
            b = self._buckets.setdefault(kind, [float(self.burst), now, 0])
            b[0] = min(float(self.burst), b[0] + (now - b[1]) * self.per_s)
            b[1] = now
            if b[0] < 1.0:
                b[2] += 1
                return None
            b[0] -= 1.0
            dropped, b[2] = int(b[2]), 0
            return dropped

    def log(self, logger: logging.Logger, level: int, kind: str, msg: str, *args,
            **fields) -> bool:
        """Log ``msg`` with ``fields`` unless ``kind`` is over its rate; True if logged."""
        if not logger.isEnabledFor(level):
            return False
        dropped = self.allow(kind)
        if dropped is None:
            return False
        if dropped:
            fields["suppressed"] = dropped
        logger.log(level, msg, *args, extra=fields)
        return True
