"""A structured request across a worker SIGKILLed mid-generation, n-gram drafting on: the
worker that resumes it re-feeds the grammar from the stored tokens, so the output still
parses, validates, and equals an undisturbed greedy run. A grammar that does not compile
fails that request alone (typed) while the worker serves the next."""
from __future__ import annotations

import json
import signal

import jsonschema
import pytest

from producer import FleetClient, RequestFailed
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
SCHEMA = {"type": "array", "items": {"enum": ["ab", "cd", "abcd"]}, "minItems": 90, "maxItems": 90}
STRUCTURED = {"type": "json_schema", "schema": SCHEMA}
SPEC = dict(speculative="ngram", num_speculative_tokens=3)


def _owner(r, request_id: str) -> str:
    owner = r.hget(keys.state_key("default", request_id), "owner")
    return owner.decode().split("#")[0] if owner else ""


def test_sigkill_mid_generation_resumes_a_structured_request_that_still_parses(workers, redis_server, r):
    procs = {w.worker_id: w for w in (workers.start(**SPEC), workers.start(**SPEC))}
    with FleetClient(redis_server.url) as fleet:
        reference = fleet.generate(prompt_token_ids=PROMPT, temperature=0.0, max_tokens=900,
                                   structured=STRUCTURED, timeout=120)
        jsonschema.validate(json.loads(reference.text), SCHEMA)
        assert reference.finish_reason == "stop" and len(reference.token_ids) > 120
        stream = fleet.submit(request_id="victim", prompt_token_ids=PROMPT, temperature=0.0, max_tokens=900,
                              structured=STRUCTURED)
        got = []
        for token in stream:
            got += token.token_ids
            if len(got) >= 40:
                break
        victim = _owner(r, "victim")
        procs[victim].signal(signal.SIGKILL)
        result = stream.result(timeout=120)
    assert result.worker_id != victim and result.num_resumes == 1
    assert result.token_ids == reference.token_ids   # greedy: as if never interrupted
    jsonschema.validate(json.loads(result.text), SCHEMA)


@pytest.mark.parametrize("structured", [{"type": "grammar", "ebnf": "root ::= ("},
                                        {"type": "regex", "pattern": "(unclosed"},
                                        {"type": "json_schema", "schema": {"type": "no-such-type"}}])
def test_a_grammar_that_does_not_compile_fails_alone_with_a_typed_failure(workers, redis_server, structured):
    workers.start()
    with FleetClient(redis_server.url) as fleet:
        with pytest.raises(RequestFailed) as err:
            fleet.generate(prompt_token_ids=PROMPT, max_tokens=8, structured=structured, timeout=60)
        assert err.value.failure.code == "invalid_grammar"
        ok = fleet.generate(prompt_token_ids=PROMPT, max_tokens=4, temperature=0.0,
                            structured={"type": "choice", "choices": ["yes", "no"]}, timeout=60)
        assert ok.finish_reason == "stop" and ok.text in ("yes", "no")
