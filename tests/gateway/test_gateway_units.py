"""Pure pieces of the gateway: options, request translation, response shapes (no Redis)."""
from __future__ import annotations

import json
import logging

import pytest

from producer.gateway import schemas, translate
from producer.gateway.errors import GatewayError
from producer.gateway.options import GatewayOptions, Quota, load_keys, parse_served_models
from producer.gateway.redact import install_log_redaction, redact
from producer.gateway.render import Renderer, TokenNames
from shared.protocol import Result, Timings, Usage

OPTIONS = GatewayOptions(redis_url="redis://x")


def test_served_models_and_keys(tmp_path, monkeypatch):
    # Without specs: the model's own name (the embedded default's, or --model's) and the namespace.
    assert parse_served_models([], "default") == {"SmolLM2-135M-Instruct": "default", "default": "default"}
    assert parse_served_models([], "ns", "/models/Qwen2-0.5B") == {"Qwen2-0.5B": "ns", "ns": "ns"}
    assert parse_served_models(["gpt=default", "smol"], "x") == {"gpt": "default", "smol": "smol"}
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": {"k1": "acme"}, "quotas": {"acme": {"max_concurrent": 2}}}))
    api_keys, quotas = load_keys(str(path), "k2=beta, k3=gamma")
    assert api_keys == {"k1": "acme", "k2": "beta", "k3": "gamma"}
    assert quotas == {"acme": Quota(max_concurrent=2)}
    with pytest.raises(ValueError):
        load_keys(None, "k=bad{tenant}")


def test_chat_translation():
    req = schemas.decode(json.dumps({
        "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 9, "stop": "\n", "logprobs": True, "top_logprobs": 2,
        "user": "u1", "seed": 3, "unknown_field": 1}).encode(), schemas.ChatRequest)
    fields = translate.chat_fields(req, OPTIONS)
    assert fields["messages"] == [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": "hi"}]
    picked = (fields["max_tokens"], fields["stop"], fields["logprobs"], fields["seed"])
    assert picked == (9, ["\n"], 2, 3)
    assert fields["metadata"] == {"user": "u1"} and fields["priority"] == "default"


@pytest.mark.parametrize("prompt, expected", [
    ("text", {"prompt": "text"}), (["text"], {"prompt": "text"}),
    ([1, 2, 3], {"prompt_token_ids": [1, 2, 3]}), ([[4, 5]], {"prompt_token_ids": [4, 5]})])
def test_completion_prompts(prompt, expected):
    req = schemas.decode(json.dumps({"model": "m", "prompt": prompt}).encode(),
                         schemas.CompletionRequest)
    fields = translate.completion_fields(req, OPTIONS)
    assert {k: fields[k] for k in expected} == expected and fields["max_tokens"] == 16


def test_several_prompts_are_refused():
    req = schemas.decode(b'{"model": "m", "prompt": ["a", "b"]}', schemas.CompletionRequest)
    with pytest.raises(GatewayError) as exc:
        translate.completion_fields(req, OPTIONS)
    assert exc.value.status == 400 and exc.value.param == "prompt"


@pytest.mark.parametrize("fleet_reason, openai_reason", [
    ("stop", "stop"), ("length", "length"), ("timeout", "length"), ("cancelled", "stop")])
def test_finish_reasons_and_usage(fleet_reason, openai_reason):
    result = Result(request_id="r1", finish_reason=fleet_reason, text="hi", token_ids=[1],
                    usage=Usage(prompt_tokens=3, completion_tokens=1, cached_tokens=2),
                    timings=Timings())
    renderer = Renderer(chat=True, response_id="r1", model="m", names=TokenNames(), logprobs=False)
    body = renderer.response(result, [])
    assert body["choices"][0]["finish_reason"] == openai_reason
    assert body["choices"][0]["message"]["content"] == "hi"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                             "prompt_tokens_details": {"cached_tokens": 2}}
    assert TokenNames()(42) == "token_id:42"


@pytest.mark.parametrize("text, expected", [
    ("from redis://fleet-gateway:s3cret@redis:6379/0", "from redis://fleet-gateway:***@redis:6379/0"),
    ("rediss://:p%40ss@h/0?ssl_ca_certs=/x", "rediss://:***@h/0?ssl_ca_certs=/x"),
    ("redis://h:6379/0 and http://127.0.0.1:8000/v1", "redis://h:6379/0 and http://127.0.0.1:8000/v1"),
    ("redis://h/0?password=s3cret&db=1", "redis://h/0?password=***&db=1"),
])
def test_redact_urls(text, expected):
    assert redact(text) == expected


def test_log_records_are_redacted_whoever_logs(caplog):
    previous = logging.getLogRecordFactory()
    install_log_redaction()
    install_log_redaction()  # idempotent
    try:
        log = logging.getLogger("some.library")
        with caplog.at_level(logging.INFO):
            log.info("%s - %s %d", "redis://u:s3cret@h/0", ValueError("redis://u:s3cret@h"), 7)
            try:
                raise RuntimeError("at redis://u:s3cret@h/0")
            except RuntimeError:
                log.exception("failed")
        record = caplog.records[0]
        assert record.args == ("redis://u:***@h/0", "redis://u:***@h", 7)  # shape kept
        assert "s3cret" not in caplog.text
        assert "RuntimeError: at redis://u:***@h/0" in caplog.text  # the traceback too
    finally:
        logging.setLogRecordFactory(previous)
