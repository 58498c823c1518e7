"""Structured outputs through the real gateway with the official ``openai`` client:
``response_format`` json_schema (every answer validated with jsonschema) and json_object,
a forced tool call (whole and streamed), and what stays refused."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 24}}}
PROMPTS = ["Describe a famous scientist.", "Invent a character for a novel.",
           "Who is the president of France?", "Tell me about a chef in Rome.",
           "Give me a random person.", "Write a haiku about the sea."]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "required": ["city", "unit"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}


def _chat(client, content, **kwargs):
    kwargs.setdefault("max_tokens", 96)
    return client.chat.completions.create(model="smol", messages=[{"role": "user", "content": content}],
                                          **kwargs)


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_json_schema_answers_validate_for_every_prompt(openai_client, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for i, prompt in enumerate(PROMPTS):
        reply = _chat(openai_client, prompt, response_format=fmt, temperature=temperature, seed=i)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_json_object_is_an_object(openai_client):
    reply = _chat(openai_client, 'Answer with a JSON object with the key "fruit".', response_format={"type": "json_object"},
                  temperature=0, max_tokens=160)
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_a_forced_tool_call_has_arguments_valid_for_the_function(openai_client):
    reply = _chat(openai_client, "What's the weather in Paris?", tools=[WEATHER], temperature=0,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_streamed_tool_call_assembles_to_valid_arguments(openai_client):
    stream = _chat(openai_client, "Weather in Oslo?", tools=[WEATHER], tool_choice="required",
                   temperature=0, stream=True)
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_tool_choice_none_answers_in_text(openai_client):
    reply = _chat(openai_client, "Say hi.", tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("kwargs,param", [
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER]}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema"),
])
def test_what_cannot_be_honoured_is_a_clear_400(openai_client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(openai_client, "hi", **kwargs)
    assert err.value.body["param"] == param


def test_a_schema_that_does_not_compile_is_refused_and_the_worker_goes_on(openai_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.APIStatusError) as err:
        _chat(openai_client, "hi", response_format=fmt)
    assert "invalid_grammar" in str(err.value.body)
    reply = _chat(openai_client, "Say hi.", temperature=0, max_tokens=4)
    assert reply.choices[0].message.content
