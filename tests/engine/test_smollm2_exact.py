"""Greedy output of the real SmolLM2-135M-Instruct is token-for-token identical to
transformers ``generate`` (fp32, CPU), for 32 mixed-length prompts submitted at once
(one continuous batch, chunked prefill), with prefix caching on and off, and with
preemption forced by a small KV budget."""
import pytest
import torch

from gpu_worker import LLM, SamplingParams
from gpu_worker.model.default_model import default_model_dir

pytestmark = pytest.mark.slow

SYSTEM = ("You are a careful assistant for a railway company. Answer briefly and politely. "
          "Timetables change on the first Sunday of each month; tickets bought online can be "
          "refunded up to one hour before departure; bicycles travel free outside rush hours; "
          "pets under ten kilograms travel free in a carrier; the night train stops at every "
          "station between the capital and the coast. Never invent a timetable. ")
QUESTIONS = ["Can I bring my bike at 8am?", "Is my cat allowed?", "When do timetables change?",
             "Can I get a refund 30 minutes before?", "Does the night train stop in small towns?",
             "What is the capital of France?", "Tell me a short joke about trains.",
             "How heavy can a pet be?"]
TEXTS = ["The history of the printing press", "def fibonacci(n):", "Once upon a time",
         "In 1969, the first humans", "Photosynthesis is", "A haiku about snow:",
         "The three laws of motion are", "Redis streams are"]
PARAGRAPH = ("Continuous batching lets a server add new requests to a running batch at every "
             "step instead of waiting for the slowest sequence to finish. ")


def build_prompts(tok):
    ps = [tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
          for q in QUESTIONS]                                                 # long shared prefix
    ps += [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    ps += [tok.encode(t) for t in TEXTS]                                      # short raw text
    ps += [tok.encode(PARAGRAPH * (2 + 3 * i) + t) for i, t in enumerate(TEXTS)]   # up to ~550 tokens
    return ps


@pytest.fixture(scope="module")
def setup(hf_reference):
    model_dir = default_model_dir()
    llm = LLM(None, kv_cache_memory=256 << 20, max_num_batched_tokens=256)
    ps = build_prompts(llm.tokenizer)
    lens = [16 + (i * 7) % 33 for i in range(len(ps))]
    refs = [hf_reference(model_dir, p, n, stop_at_eos=True) for p, n in zip(ps, lens)]
    return llm, ps, lens, refs, model_dir


def _check(outs, ps, refs, model_dir):
    bad = []
    for i, (p, o, ref) in enumerate(zip(ps, outs, refs)):
        if o.token_ids != ref:
            bad.append(f"prompt {i}: {_divergence(model_dir, p, o.token_ids, ref)}")
    assert not bad, "\n".join(bad)


def _divergence(model_dir, prompt, got, ref):
    """Where outputs part, and the reference's top-2 logit gap there (a gap < 1e-4 is a tie)."""
    from transformers import AutoModelForCausalLM

    k = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ref[:k]])).logits[0, -1]
    top = logits.topk(2).values
    return f"diverge at output {k}: got {got[k:k + 3]} want {ref[k:k + 3]}, top-2 gap {float(top[0] - top[1]):.2e}"


def test_one_batch_prefix_cache_on(setup):
    llm, ps, lens, refs, model_dir = setup
    outs = llm.generate(ps, [SamplingParams(temperature=0, max_tokens=n) for n in lens])
    _check(outs, ps, refs, model_dir)
    assert llm.engine.kv.prefix_hits > 0


def test_one_batch_prefix_cache_off(setup):
    _, ps, lens, refs, model_dir = setup
    llm = LLM(None, kv_cache_memory=256 << 20, max_num_batched_tokens=256, enable_prefix_caching=False)
    outs = llm.generate(ps, [SamplingParams(temperature=0, max_tokens=n) for n in lens])
    _check(outs, ps, refs, model_dir)
    assert llm.engine.kv.prefix_hits == 0


def test_one_batch_with_forced_preemption(setup):
    _, ps, lens, refs, model_dir = setup
    # 80 blocks of 16 tokens (about 58 MiB): the 32 requests need far more at once.
    llm = LLM(None, kv_cache_memory=80 * 16 * 46080, max_num_batched_tokens=256)
    outs = llm.generate(ps, [SamplingParams(temperature=0, max_tokens=n) for n in lens])
    _check(outs, ps, refs, model_dir)
    assert llm.engine.scheduler.num_preemptions > 0
