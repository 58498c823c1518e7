"""docs/protocol.md says what the code does: every failure code (the fleet's and the
engine's), every request field, every name, the limits, and the ACL rule a tenant gets."""
from __future__ import annotations

import re
from pathlib import Path

from shared import errors, keys, limits
from shared.protocol import Request
from shared.tenants import TenantConfig, acl_user

REPO = Path(__file__).resolve().parents[2]
SPEC = (REPO / "docs" / "protocol.md").read_text()
ENGINE_CODE = re.compile(r"""["'](invalid_[a-z_]+|too_many_[a-z_]+|[a-z]+_too_long|empty_[a-z]+|"""
                         r"""exceeds_[a-z_]+|duplicate_[a-z_]+)["']""")


def _mentioned(word: str) -> bool:
    return f"`{word}`" in SPEC


def test_every_failure_code_is_specified():
    fleet = {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, str)}
    engine = set()
    for path in (REPO / "gpu_worker").rglob("*.py"):  # the files that raise the engine's errors
        text = path.read_text()
        if "InvalidRequestError" in text:
            engine |= set(ENGINE_CODE.findall(text))
    # f"invalid_{name}" for the two penalties
    engine |= {"invalid_presence_penalty", "invalid_frequency_penalty"}
    engine.discard("invalid_")
    assert len(fleet) >= 7 and len(engine) >= 15
    missing = sorted(c for c in fleet | engine if not _mentioned(c))
    assert not missing, missing


def test_every_request_field_is_specified():
    missing = [f for f in Request.__struct_fields__ if not _mentioned(f)]
    assert not missing, missing


def test_the_names_are_the_ones_the_code_uses():
    names = [keys.stream_key("MODEL", "TENANT", "high").replace(":high", ":LANE"),
             keys.legacy_stream_key("MODEL", "high").replace(":high", ":LANE"),
             keys.tenants_key(), keys.dead_letter_key("MODEL"), keys.control_channel("MODEL"),
             keys.workers_key("MODEL"), keys.worker_key("MODEL", "WID")]
    names += [f(t, i) for f in (keys.state_key, keys.progress_key, keys.cancel_key, keys.channel)
              for t, i in [("TENANT", "ID")]]
    missing = [n for n in names if f"`{n}`" not in SPEC]
    assert not missing, missing
    for pattern in (limits.REQUEST_ID_PATTERN, limits.TENANT_PATTERN):
        assert f"`{pattern}`" in SPEC


def test_the_acl_rule_quoted_is_the_one_rendered():
    rule = acl_user(TenantConfig(name="acme", lanes=["high", "default"]), "<sha256 of the password>")
    assert rule in SPEC


def test_the_limits_quoted_are_the_ones_enforced():
    for value in (limits.MAX_PAYLOAD_BYTES, limits.MAX_PROMPT_CHARS, limits.MAX_PROMPT_TOKENS,
                  limits.MAX_MESSAGE_CHARS, limits.MAX_TOKENS, limits.MAX_METADATA_VALUE_CHARS):
        assert f"{value:,}" in SPEC, value
    for value in (limits.MAX_MESSAGES, limits.MAX_STOP_STRINGS, limits.MAX_STOP_STRING_CHARS,
                  limits.MAX_STOP_TOKEN_IDS, limits.MAX_LOGPROBS, limits.MAX_METADATA_ITEMS,
                  limits.MAX_METADATA_KEY_CHARS, limits.MAX_JSON_DEPTH):
        assert re.search(rf"\b{value}\b", SPEC), value
