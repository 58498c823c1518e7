"""Structured outputs in the engine (tiny random-weight model: only the grammar makes its
output valid): masks in the batched sampler, every kind, drafts checked and rolled back,
preemption, a resumed request re-fed, and a grammar that does not compile failing alone."""
import json
import re
import time

import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.errors import InvalidRequestError
from gpu_worker.sampler import Sampler, SamplingRow
from gpu_worker.structured import StructuredSpec
from gpu_worker.structured.masks import apply_grammar_masks

# Kinds whose every sentence is short: a random model ends them (json_object, unbounded
# strings and numbers are tested with the real model, tests/engine/test_structured_smollm2.py).
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
          "required": ["ok", "tag"]}
KINDS = [
    (StructuredSpec.json_schema(SCHEMA), lambda t: set(json.loads(t)) == {"ok", "tag"}),
    (StructuredSpec("regex", r"(ab|cd){3,6}x"), lambda t: re.fullmatch(r"(ab|cd){3,6}x", t)),
    (StructuredSpec.choice(["red", "green", "blue"]), lambda t: t in ("red", "green", "blue")),
    (StructuredSpec("grammar", 'root ::= "(" [0-9] [0-9]? ")"'), lambda t: re.fullmatch(r"\(\d\d?\)", t)),
    (StructuredSpec("regex", r"[a-c]{2}-[0-9]{2}"), lambda t: re.fullmatch(r"[a-c]{2}-[0-9]{2}", t)),
]
PROMPTS = [[5, 6, 7, 8], [100, 200, 300], [42] * 9, [7, 7, 8, 8, 9], [1000, 2000, 1000, 2000]]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, kv_cache_memory=64 << 20)


@pytest.fixture(scope="module")
def grammars(llm):
    return llm.engine.grammars


def _params(spec, temperature=0.0, seed=None, max_tokens=48):
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, structured=spec)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_every_kind_gives_valid_output_from_a_random_model(llm, temperature):
    specs = [spec for spec, _ in KINDS]
    outs = llm.generate(PROMPTS, [_params(s, temperature, seed=i) for i, s in enumerate(specs)])
    for (spec, valid), out in zip(KINDS, outs):
        assert out.finish_reason == "stop", (spec.kind, out.text, out.error_message)
        assert valid(out.text), (spec.kind, out.text)
        assert out.token_ids[-1] in llm.engine.model_config.eos_token_ids   # EOS once complete


def test_unconstrained_rows_are_untouched_and_constrained_rows_masked(grammars, llm):
    vocab = llm.engine.vocab_size
    state = grammars.compile_now(StructuredSpec.choice(["yes", "no"]))
    logits = torch.randn(2, vocab)
    before = logits.clone()
    rows = [SamplingRow(SamplingParams(temperature=0), 3, [1, 2], [], (2,), grammar=state),
            SamplingRow(SamplingParams(temperature=0), 3, [1, 2], [], (2,))]
    assert apply_grammar_masks(logits, rows)
    assert torch.equal(logits[1], before[1])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    texts = {llm.tokenizer.decode([t]) for t in allowed}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts), texts
    assert not apply_grammar_masks(before, rows[1:])   # nothing constrained: nothing done


def test_eos_only_where_the_grammar_is_complete(grammars, llm):
    eos = llm.engine.model_config.eos_token_ids[0]
    state = grammars.compile_now(StructuredSpec.choice(["yes"]))
    row = SamplingRow(SamplingParams(temperature=0), 0, [1], [], (eos,), grammar=state)
    logits = torch.zeros(1, llm.engine.vocab_size)
    apply_grammar_masks(logits, [row])
    assert logits[0, eos] == float("-inf")
    assert state.feed(_ids(llm, "yes"))
    logits = torch.zeros(1, llm.engine.vocab_size)
    apply_grammar_masks(logits, [row])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [eos]


def _ids(llm, text):
    return llm.tokenizer.hf(text, add_special_tokens=False)["input_ids"]


def test_draft_rows_are_masked_after_their_drafts_and_the_matcher_rolled_back(grammars, llm):
    state = grammars.compile_now(StructuredSpec("regex", "abcabc"))
    drafts = _ids(llm, "abcabc")
    wrong = _ids(llm, "x")
    rows = [SamplingRow(SamplingParams(temperature=0), j, [1], list(d), (2,), grammar=state, num_drafts=j)
            for j, d in enumerate([[], drafts[:1], drafts[:1] + wrong])]
    logits = torch.zeros(3, llm.engine.vocab_size)
    apply_grammar_masks(logits, rows)
    assert torch.isfinite(logits[0, drafts[0]]) and torch.isfinite(logits[1, drafts[1]])
    assert logits[0, drafts[1]] == float("-inf") or drafts[0] == drafts[1]
    assert state.valid_prefix(drafts) == len(drafts)   # rolled back: the state is the start again
    sampler = Sampler()
    tokens, _ = sampler.sample(torch.zeros(1, llm.engine.vocab_size), rows[:1])
    assert tokens[0] == drafts[0] or llm.tokenizer.decode(tokens).startswith("a")


@pytest.mark.parametrize("proposer", ["ngram", "self"])
def test_spec_and_preemption_keep_the_grammar_and_the_greedy_output(tiny_llama_dir, llm, proposer):
    specs = [spec for spec, _ in KINDS] * 2
    # More than the small KV cache holds at once (preemption), with text to draft from.
    prompts = [p * 4 + _ids(llm, "(12)ab-12 true, \"tag\": \"a\"}abcdabcdx") for p in PROMPTS] * 2
    want = [o.token_ids for o in llm.generate(prompts, [_params(s) for s in specs])]
    small = LLM(tiny_llama_dir, kv_cache_memory=16 * 16 * 256, max_num_batched_tokens=64,
                speculative=proposer, num_speculative_tokens=3, spec_adaptive=False, self_draft_layers=1)
    for spec in specs:  # compiled first: how long a compile takes must not change the schedule
        small.engine.grammars.compile_now(spec)
    outs = small.generate(prompts, [_params(s) for s in specs])
    assert [o.token_ids for o in outs] == want
    for (spec, valid), out in zip(KINDS * 2, outs):
        assert out.finish_reason == "stop" and valid(out.text), (spec.kind, out.text)
    stats = small.engine.stats()
    assert stats["num_preemptions"] > 0
    if proposer == "ngram":   # the prompts hold the grammar's text; a random early exit drafts none it takes
        assert sum(stats["spec_drafted_tokens"].values()) > 0


class _Proposer:
    """Drafts the known greedy continuation (``right``) or a token off it."""

    name, uses_model, observe = "test", False, None

    def __init__(self, want: dict, right: bool) -> None:
        self.want, self.right = want, right

    def propose(self, items):
        out = {}
        for it in items:
            req = it.request
            rest = self.want[tuple(req.prompt_token_ids)][req.num_output_tokens:][:it.k]
            out[req.request_id] = rest if self.right else [(t + 1) for t in rest]
        return out


@pytest.mark.parametrize("right", [True, False])
def test_drafts_accepted_or_rolled_back_give_the_same_output(tiny_llama_dir, llm, right):
    spec = StructuredSpec("regex", r"(ab|cd){3,6}x")
    want = llm.generate(PROMPTS[:3], _params(spec, max_tokens=30))
    spec_llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20, speculative="ngram", spec_adaptive=False)
    spec_llm.engine.speculator.proposer = _Proposer({tuple(p): o.token_ids for p, o in zip(PROMPTS, want)}, right)
    outs = spec_llm.generate(PROMPTS[:3], _params(spec, max_tokens=30))
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]
    stats = spec_llm.engine.stats()
    assert (sum(stats["spec_accepted_tokens"].values()) > 0) == right


def test_a_resumed_request_feeds_its_stored_tokens_to_the_grammar(llm):
    spec = StructuredSpec("regex", r"(ab|cd){3,6}x")
    whole = llm.generate([PROMPTS[0]], _params(spec))[0]
    engine = llm.engine
    engine.add_request("resumed", PROMPTS[0], _params(spec), resume_token_ids=whole.token_ids[:3])
    engine.add_request("bad-resume", PROMPTS[0], _params(spec), resume_token_ids=_ids(llm, "zz"))
    got, ended = list(whole.token_ids[:3]), {}
    while engine.has_unfinished_requests():
        for d in engine.step():
            if d.request_id == "resumed":
                got += d.new_token_ids
            if d.finished:
                ended[d.request_id] = d
    assert got == whole.token_ids
    assert ended["bad-resume"].error_code == "invalid_resume"


def test_a_grammar_that_does_not_compile_fails_alone(llm):
    good = StructuredSpec.choice(["on", "off"])
    bad = [StructuredSpec("grammar", "root ::= ("), StructuredSpec("regex", "(unclosed"),
           StructuredSpec.json_schema({"type": "no-such-type"})]
    outs = llm.generate([PROMPTS[0]] * 4, [_params(s) for s in [*bad, good]])
    for out in outs[:3]:
        assert out.finish_reason == "error" and out.error_code == "invalid_grammar", out
    assert outs[3].finish_reason == "stop" and outs[3].text in ("on", "off")


@pytest.mark.parametrize("spec,params", [
    (StructuredSpec("yaml", "x"), {}),
    (StructuredSpec("regex", ""), {}),
    (StructuredSpec("choice", "[]"), {}),
    (StructuredSpec("choice", '["a", ""]'), {}),
    (StructuredSpec("json_schema", "[1]"), {}),
    (StructuredSpec("json_schema", "{nope"), {}),
    (StructuredSpec("regex", "a" * 70000), {}),
    (StructuredSpec("json_object"), {"ignore_eos": True}),
])
def test_specs_refused_before_anything_is_queued(llm, spec, params):
    with pytest.raises(InvalidRequestError) as err:
        llm.engine.add_request("refused", [1, 2], SamplingParams(structured=spec, **params))
    assert err.value.code == "invalid_grammar"
    assert not llm.engine.has_unfinished_requests()


def test_compilation_is_cached_per_kind_and_spec(grammars):
    spec = StructuredSpec("regex", "[0-9]{4}")
    grammars.compile_now(spec)
    n = grammars.num_compiled
    grammars.compile_now(StructuredSpec("regex", "[0-9]{4}"))
    assert grammars.num_compiled == n
    grammars.compile_now(StructuredSpec("grammar", 'root ::= [0-9] [0-9] [0-9] [0-9]'))
    assert grammars.num_compiled == n + 1


def test_a_slow_compilation_fails_its_request_at_the_time_limit(tiny_llama_dir, monkeypatch):
    from gpu_worker.structured.compiler import GrammarCompiler

    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20)
    llm.engine.grammars.compile_now(StructuredSpec("regex", "[0-9]"))    # the compiler itself is built
    compile_ = GrammarCompiler._compile
    monkeypatch.setattr(GrammarCompiler, "_compile", lambda self, spec: time.sleep(1.0) or compile_(self, spec))
    llm.engine.grammars.timeout_s = 0.2
    outs = llm.generate([PROMPTS[0], PROMPTS[1]], [_params(StructuredSpec("regex", "[a-z]{40}")),
                                                   SamplingParams(temperature=0, max_tokens=3)])
    assert outs[0].error_code == "invalid_grammar" and "longer than" in outs[0].error_message
    assert outs[1].finish_reason == "length"


def test_building_the_compiler_does_not_count_against_the_time_limit(tiny_llama_dir, monkeypatch):
    """The tokenizer table xgrammar builds once (seconds for a 49k vocabulary on a loaded
    machine) is not charged to the first request's grammar."""
    import xgrammar as xgr

    build = xgr.TokenizerInfo.from_huggingface
    monkeypatch.setattr(xgr.TokenizerInfo, "from_huggingface",
                        staticmethod(lambda *a, **k: time.sleep(1.0) or build(*a, **k)))
    llm = LLM(tiny_llama_dir, kv_cache_memory=64 << 20)
    llm.engine.grammars.timeout_s = 0.5
    out = llm.generate([PROMPTS[0]], _params(StructuredSpec("regex", "[0-9]{4}")))[0]
    assert out.error_code is None and re.fullmatch("[0-9]{4}", out.text), (out.error_message, out.text)


def test_every_wire_form_maps_to_its_spec():
    import msgspec

    from gpu_worker.structured import from_wire
    from shared.protocol import Request

    forms = {"json_object": ({}, ""), "json_schema": ({"schema": {"type": "object"}}, '{"type":"object"}'),
             "regex": ({"pattern": "a+"}, "a+"), "choice": ({"choices": ["x", "y"]}, '["x", "y"]'),
             "grammar": ({"ebnf": 'root ::= "a"'}, 'root ::= "a"')}
    for kind, (extra, text) in forms.items():
        req = msgspec.convert({"request_id": "r", "prompt": "p", "structured": {"type": kind, **extra}}, Request)
        assert from_wire(req.structured) == StructuredSpec(kind, text)
    assert from_wire(None) is None


def test_the_throughput_bench_constrains_every_request_to_full_length(llm):
    from gpu_worker.bench.throughput import _run_engine
    from gpu_worker.bench.workload import mixed_workload

    items = mixed_workload(3, seed=1)
    _, outputs = _run_engine(llm, items, structured=True)
    assert [len(o) for o in outputs] == [i.max_tokens for i in items]
    text = llm.tokenizer.decode(outputs[0])
    assert text.startswith("[{\"word\": \"")   # the schema's shape, compactly written


def test_n_samples_each_keep_their_own_grammar(llm):
    spec = StructuredSpec("regex", r"(ab|cd){3,6}x")
    out = llm.generate([PROMPTS[1]], _params(spec, temperature=1.0, seed=3), n=4)[0]
    assert len(out.choices) == 4
    for c in out.choices:
        assert c.finish_reason == "stop" and re.fullmatch(r"(ab|cd){3,6}x", c.text), c.text


def test_a_compiling_grammar_does_not_hold_up_other_requests(tiny_llama_dir, monkeypatch):
    import threading

    from gpu_worker.structured.compiler import GrammarCompiler

    release = threading.Event()
    compile_ = GrammarCompiler._compile
    monkeypatch.setattr(GrammarCompiler, "_compile", lambda self, spec: release.wait(30) and compile_(self, spec))
    engine = LLM(tiny_llama_dir, kv_cache_memory=64 << 20).engine
    engine.add_request("slow", PROMPTS[0], _params(StructuredSpec.choice(["on", "off"])))
    engine.add_request("plain", PROMPTS[1], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    ended = {}
    while "plain" not in ended:
        ended.update({d.request_id: d for d in engine.step() if d.finished})
    assert "slow" not in ended   # still compiling while the other request ran to its end
    release.set()
    while engine.has_unfinished_requests():
        ended.update({d.request_id: d for d in engine.step() if d.finished})
    assert ended["slow"].finish_reason == "stop"


def test_the_grammar_ends_the_request_whatever_min_tokens_says(llm):
    spec = StructuredSpec.choice(["yes", "no"])
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20, min_tokens=10, structured=spec))[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")
    engine = llm.engine   # resumed with every token, EOS included: it ends at once
    engine.add_request("done", PROMPTS[0], _params(spec), resume_token_ids=out.token_ids)
    ended = {}
    while engine.has_unfinished_requests():
        ended.update({d.request_id: d for d in engine.step() if d.finished})
    assert ended["done"].finish_reason == "stop" and ended["done"].num_output_tokens == len(out.token_ids)


def test_compile_now_raises_the_typed_error(grammars):
    with pytest.raises(InvalidRequestError) as err:
        grammars.compile_now(StructuredSpec("grammar", "root ::= ("))
    assert err.value.code == "invalid_grammar"
