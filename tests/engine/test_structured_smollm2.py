"""Every structured kind with the real SmolLM2-135M-Instruct, greedy and sampled: the
output parses (json_object, json_schema validated with jsonschema) or matches."""
import json
import re

import jsonschema
import pytest

from gpu_worker import LLM, SamplingParams
from gpu_worker.structured import StructuredSpec

BOOK = {"type": "object", "additionalProperties": False, "required": ["title", "year", "genres"],
        "properties": {"title": {"type": "string", "maxLength": 40},
                       "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
                       "genres": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                  "minItems": 1, "maxItems": 3}}}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
EBNF = 'root ::= item ("," item){0,3}\nitem ::= [A-Z] [a-z]{1,10}'
CASES = [
    ("Describe your favourite food as a JSON object.", StructuredSpec("json_object"),
     lambda t: isinstance(json.loads(t), dict)),
    ("Tell me about a classic novel.", StructuredSpec.json_schema(BOOK),
     lambda t: jsonschema.validate(json.loads(t), BOOK) is None),
    ("When did the Apollo 11 landing happen? Answer with a date.", StructuredSpec("regex", DATE),
     lambda t: re.fullmatch(DATE, t)),
    ("Is the sky blue? Answer yes or no.", StructuredSpec.choice(["yes", "no"]), lambda t: t in ("yes", "no")),
    ("Name some European capitals.", StructuredSpec("grammar", EBNF),
     lambda t: re.fullmatch(r"[A-Z][a-z]{1,10}(,[A-Z][a-z]{1,10}){0,3}", t)),
]


@pytest.fixture(scope="module")
def llm():
    return LLM(num_threads=1)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_every_kind_with_the_real_model(llm, temperature):
    prompts = [[{"role": "user", "content": p}] for p, _, _ in CASES]
    params = [SamplingParams(temperature=temperature, seed=7, max_tokens=120, structured=s) for _, s, _ in CASES]
    for (_, spec, valid), out in zip(CASES, llm.generate(prompts, params)):
        assert out.finish_reason == "stop", (spec.kind, out.text)
        assert valid(out.text), (spec.kind, out.text)
