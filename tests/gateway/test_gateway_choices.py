"""``n`` through the gateway with the official ``openai`` client, and the README's gateway
command + OpenAI snippet run as written (the served model name is the model's own)."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fleet_harness import WorkerFactory
from gateway_harness import start_gateway
from redis_server import REPO, RedisServer, free_port

CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def readme_fleet(tmp_path_factory):
    """A fresh fleet as the README starts it: one worker on the embedded model, no tenants
    registered, and ``fleet gateway`` with no more than the README's flags."""
    tmp = tmp_path_factory.mktemp("readme-fleet")
    server = RedisServer().start()
    factory = WorkerFactory(server, None, tmp)
    worker = factory.start(wait=False, model=None, worker_id="readme-worker", kv_cache_memory="64MiB")
    port = free_port()
    gateway = start_gateway(server.url, tmp / "gateway.log", port, "--host", "127.0.0.1")
    factory.wait_ready(worker)
    yield gateway
    gateway.stop()
    factory.cleanup()
    server.stop()


@pytest.fixture(scope="module")
def client(readme_fleet):
    from openai import OpenAI

    c = OpenAI(base_url=readme_fleet.url + "/v1", api_key="sk-anything", max_retries=0, timeout=120)
    yield c
    c.close()


def _readme_snippet() -> str:
    readme = (Path(REPO) / "README.md").read_text()
    section = readme[readme.index("## Using the OpenAI API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_snippet_runs_as_written(readme_fleet, capsys):
    code = _readme_snippet().replace("http://127.0.0.1:8000", readme_fleet.url)
    assert 'model="SmolLM2-135M-Instruct"' in code
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "The capital of France is Paris."
    served = [m["id"] for m in httpx.get(readme_fleet.url + "/v1/models").json()["data"]]
    assert "SmolLM2-135M-Instruct" in served


def test_chat_n3_choices_differ_under_sampling_and_repeat_under_a_seed(client):
    def ask(**extra):
        return client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=CHAT, n=3,
                                              temperature=1.0, max_tokens=16, **extra)

    reply = ask(seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) == 3
    assert [c.message.content for c in ask(seed=5).choices] == texts
    assert len({c.message.content for c in ask().choices}) == 3
    assert reply.usage.completion_tokens <= 48 and reply.usage.completion_tokens >= 3
    # Streamed: chunks carry their choice's index; per index they spell the same answers.
    chunks = list(client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=CHAT, n=3, temperature=1.0, max_tokens=16,
        seed=5, stream=True, stream_options={"include_usage": True}))
    streamed = {i: "" for i in range(3)}
    roles, finishes = set(), {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            roles |= {c.index} if c.delta.role == "assistant" else set()
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert roles == {0, 1, 2} and set(finishes) == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_completions_n2_and_limits(client):
    reply = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Once upon a time",
                                      n=2, temperature=1.0, max_tokens=8, seed=3)
    assert [c.index for c in reply.choices] == [0, 1] and reply.choices[0].text != reply.choices[1].text
    assert reply.usage.completion_tokens == 16
    from openai import BadRequestError

    with pytest.raises(BadRequestError):
        client.completions.create(model="SmolLM2-135M-Instruct", prompt="x", n=17, max_tokens=2)
