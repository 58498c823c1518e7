"""Bad requests get OpenAI-shaped 4xx errors that say what is wrong."""
from __future__ import annotations

import httpx
import openai
import pytest

from shared import limits as L

CHAT = [{"role": "user", "content": "Hi"}]


def _post(gateway_url: str, path: str, body, key: str = "sk-acme") -> httpx.Response:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(gateway_url + path, headers={"Authorization": f"Bearer {key}"},
                      timeout=60, **kwargs)


def _error(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("body, param, says", [
    ({"model": "smol"}, "messages", "'messages' is a required property"),
    ({"model": "smol", "messages": []}, "messages", "length >= 1"),
    ({"model": "smol", "messages": CHAT, "temperature": 3}, "temperature", "<= 2.0"),
    ({"model": "smol", "messages": CHAT, "temperature": "hot"}, "temperature", "Expected `float`"),
    ({"model": "smol", "messages": CHAT, "n": 17}, "n", "n=17 is more than the fleet's 16"),
    ({"model": "smol", "messages": [{"role": "user"}], "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"model": "smol", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role",
     "Invalid enum value 'robot'"),
    ({"model": "smol", "messages": CHAT, "top_logprobs": 2}, "top_logprobs", "requires logprobs"),
    ({"model": "smol", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content", "text only"),
    ({"messages": CHAT}, "model", "'model' is a required property"),
])
def test_chat_bad_requests_are_400(gateway_url, body, param, says):
    error = _error(_post(gateway_url, "/v1/chat/completions", body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert says in error["message"]


def test_invalid_json_and_unknown_model(gateway_url):
    error = _error(_post(gateway_url, "/v1/completions", b"{not json"), 400)
    assert error["code"] == "invalid_json"
    error = _error(_post(gateway_url, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)
    assert error["code"] == "model_not_found" and "'gpt-9'" in error["message"]


def test_openai_client_sees_typed_errors(openai_client):
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.chat.completions.create(model="smol", messages=CHAT, n=17)
    assert exc.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="nope", prompt="x")


def test_oversized_prompts(gateway_url, openai_client):
    huge = "a" * (L.MAX_PROMPT_CHARS + 1)  # refused by the gateway itself
    error = _error(_post(gateway_url, "/v1/completions", {"model": "smol", "prompt": huge}), 400)
    assert error["param"] == "prompt" and str(L.MAX_PROMPT_CHARS) in error["message"]
    too_long = "hello " * 9000  # fits the wire limits, not the model: the worker refuses it
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as exc:
            openai_client.completions.create(model="smol", prompt=too_long, max_tokens=4,
                                             stream=stream)
        assert exc.value.body["code"] == "context_length_exceeded"
        assert exc.value.status_code == 400


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/nope", 404), ("POST", "/v1/embeddings", 404), ("GET", "/v1/chat/completions", 405),
    ("DELETE", "/v1/models", 405), ("PUT", "/health", 405)])
def test_unknown_paths_and_methods_are_json(gateway_url, method, path, status):
    reply = httpx.request(method, gateway_url + path, headers={"Authorization": "Bearer sk-acme"})
    error = _error(reply, status)
    assert error["code"] == {404: "not_found", 405: "method_not_allowed"}[status]
    if status == 405:
        assert reply.headers["Allow"]
