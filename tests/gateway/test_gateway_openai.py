"""The official ``openai`` client against the gateway: greedy answers equal the offline API's."""
from __future__ import annotations

import httpx

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The three primary colors are"


def test_chat_whole_equals_offline(openai_client, offline):
    reply = openai_client.chat.completions.create(model="smol", messages=CHAT, temperature=0,
                                                  max_tokens=24, user="alice")
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == offline(CHAT, 24) == "The capital of France is Paris."
    assert choice.finish_reason == "stop"
    assert reply.id.startswith("chatcmpl-") and reply.model == "smol"
    assert reply.usage.completion_tokens >= 1
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_stream_equals_offline_with_usage(openai_client, offline):
    chat = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a large animal."}]
    stream = openai_client.chat.completions.create(
        model="smol", messages=chat, temperature=0, max_completion_tokens=20, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == offline(chat, 20)
    finishes = [c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert len({c.id for c in chunks}) == 1


def test_completions_whole_and_stream_equal_offline(openai_client, offline):
    expected = offline(PROMPT, 12)
    whole = openai_client.completions.create(model="smol", prompt=PROMPT, temperature=0,
                                             max_tokens=12)
    assert whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    stream = openai_client.completions.create(model="smol", prompt=PROMPT, temperature=0,
                                              max_tokens=12, stream=True)
    assert "".join(c.choices[0].text for c in stream) == expected


def test_stop_sequence_and_token_id_prompt(openai_client, offline):
    full = offline(PROMPT, 12)
    stop = full.strip().split()[1]  # a word in the middle of the greedy answer
    reply = openai_client.completions.create(model="smol", prompt=PROMPT, temperature=0,
                                             max_tokens=12, stop=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == full[:full.index(stop)]


def test_logprobs_chat_and_completions(openai_client):
    chat = openai_client.chat.completions.create(model="smol", messages=CHAT, temperature=0,
                                                 max_tokens=4, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
    comp = openai_client.completions.create(model="smol", prompt=PROMPT, temperature=0,
                                            max_tokens=3, logprobs=2)
    lp = comp.choices[0].logprobs
    assert "".join(lp.tokens) == comp.choices[0].text
    assert len(lp.token_logprobs) == 3 and all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_models_health_ready(openai_client, gateway_url):
    assert sorted(m.id for m in openai_client.models.list()) == ["idle", "smol"]
    assert httpx.get(gateway_url + "/health").json() == {"status": "ok"}
    ready = httpx.get(gateway_url + "/ready").json()
    assert ready["status"] == "ready" and ready["workers"]["smol"] == 1
