"""Secrets out of logs: ``redis://user:password@host`` -> ``redis://user:***@host``.

The gateway's Redis URL carries its ACL password, and library messages (redis-py, uvicorn,
tracebacks) may quote a URL. :func:`install_log_redaction` rewrites every log record the
process creates, whoever logs it and whichever handler writes it.
"""
from __future__ import annotations

import logging
import re
import traceback

# scheme://[user]:password@ -- the password is everything up to the last '@' of the
# authority (passwords may hold '@' only percent-encoded, but be lenient).
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#\s@]*:)[^\s/?#]*@")
_PASSWORD_PARAM = re.compile(r"(?i)(?P<head>[?&;](?:password|pass|pwd)=)[^&\s#]*")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    text = _CREDENTIALS.sub(r"\g<head>***@", text)
    return _PASSWORD_PARAM.sub(r"\g<head>***", text)


def _redact_arg(arg):
    if isinstance(arg, str):
        return redact(arg)
    if isinstance(arg, (int, float, bytes, type(None))):
        return arg
    try:
        text = str(arg)  # an exception or a client object may quote its URL
    except Exception:  # noqa: BLE001 -- a broken __str__ is not ours to break
        return arg
    clean = redact(text)
    return arg if clean == text else clean


def _redacted_record_factory(make_record):
    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        # msg and args are redacted apart, not merged: some formatters (uvicorn's access
        # log) read the args themselves.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        if record.exc_info and record.exc_info[1] is not None:
            # Formatters reuse exc_text when it is set: a redacted traceback is what they print.
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = redact(text).rstrip("\n")
        return record

    factory.redacting = True  # type: ignore[attr-defined]
    return factory


def install_log_redaction() -> None:
    """Redact every log record of this process from now on (idempotent)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "redacting", False):
        logging.setLogRecordFactory(_redacted_record_factory(current))
