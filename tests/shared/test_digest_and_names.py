"""The request digest (what id_conflict compares) and the default served model name."""
from __future__ import annotations

import msgspec
import pytest

from gpu_worker.edge.choices import resume_choices
from gpu_worker.model.default_model import DEFAULT_MODEL_NAME
from shared import codec
from shared.digest import request_digest
from shared.model_names import EMBEDDED_MODEL_NAME, model_name_of
from shared.protocol import Request, Token

BASE = Request(request_id="r", prompt="hi", max_tokens=8, seed=1)


@pytest.mark.parametrize("change", [dict(prompt="ho"), dict(max_tokens=9), dict(seed=2), dict(n=2),
                                    dict(temperature=0.5), dict(stop=["x"]), dict(logprobs=0),
                                    dict(prompt=None, prompt_token_ids=[1, 2])])
def test_what_changes_the_answer_changes_the_digest(change):
    assert request_digest(msgspec.structs.replace(BASE, **change)) != request_digest(BASE)


@pytest.mark.parametrize("change", [dict(tenant="acme"), dict(priority="batch"), dict(deadline=4e9),
                                    dict(submitted_at=1.0), dict(metadata={"try": "2"})])
def test_what_a_retry_may_change_keeps_the_digest(change):
    assert request_digest(msgspec.structs.replace(BASE, **change)) == request_digest(BASE)


def test_the_digest_of_a_decoded_request_equals_the_senders():
    assert request_digest(codec.decode_request(codec.encode(BASE))) == request_digest(BASE)
    assert len(request_digest(BASE)) == 32


def test_the_served_model_name_is_the_models_own():
    assert EMBEDDED_MODEL_NAME == DEFAULT_MODEL_NAME == model_name_of(None)
    assert model_name_of("/models/Qwen2.5-0.5B-Instruct/") == "Qwen2.5-0.5B-Instruct"
    assert model_name_of("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"


def test_resume_reads_each_choice_up_to_its_own_first_gap():
    def ev(index, seq, ids):
        return codec.encode(Token(request_id="r", seq=seq, token_ids=ids, text=str(ids), index=index))

    events = [ev(0, 0, [1]), ev(1, 0, [7]), ev(0, 1, [2]), ev(1, 0, [7]), ev(1, 2, [9]), ev(0, 2, [3]),
              ev(1, 1, [8])]
    assert resume_choices(events, 2) == [([1, 2, 3], "[1][2][3]"), ([7], "[7]")]
    assert resume_choices(events, 1) == [([1, 2, 3], "[1][2][3]")]
