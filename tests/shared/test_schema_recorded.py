"""Real traffic, recorded from a worker and both clients, is valid against the committed
schema: every request the Python and TypeScript clients sent, every event a worker
published (token events with logprobs, results of every finish reason, typed failures) and
the cancel notices. No worker needed, so it runs everywhere.

The file is written by the conformance suite: ``rm tests/conformance/recorded_traffic.jsonl;
FLEET_RECORD_TRAFFIC=$PWD/tests/conformance/recorded_traffic.jsonl pytest tests/conformance``.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from shared import codec
from shared.schema import protocol_schema

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "conformance" / "recorded_traffic.jsonl"


def _messages() -> list[dict]:
    return [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]


def test_every_recorded_message_is_valid_against_the_committed_schema():
    committed = json.loads((REPO / "docs" / "protocol.schema.json").read_text())
    assert committed == protocol_schema()
    check = jsonschema.Draft202012Validator(committed)
    errors = [(m, e.message) for m in _messages() for e in list(check.iter_errors(m))[:1]]
    assert not errors, errors[:5]


def test_the_recording_covers_every_kind_of_message():
    messages = _messages()
    kinds = {(m.get("type", "request"), m.get("finish_reason") or m.get("code") or "")
             for m in messages}
    assert {("result", r) for r in ("stop", "length", "cancelled", "timeout")} <= kinds, kinds
    assert {("failure", c) for c in ("malformed", "invalid_token_id", "tenant_mismatch")} <= kinds
    assert {("token", ""), ("request", ""), ("cancel", "")} <= kinds
    assert any(m.get("type") == "token" and m.get("logprobs") for m in messages)
    assert any(len(m.get("token_ids", [])) > 1 and m.get("type") == "token" for m in messages)
    requests = [m for m in messages if "type" not in m]
    assert {"prompt_token_ids", "messages"} <= {k for r in requests for k in r}


def test_every_recorded_message_decodes_with_the_python_structs():
    for m in _messages():
        raw = json.dumps(m).encode()
        if m.get("type") in ("token", "result", "failure"):
            codec.decode_event(raw)
        elif m.get("type") == "cancel":
            codec.decode_cancel(raw)
        else:
            codec.decode_request(raw)
