"""The engine's greedy rows take their token from the greedy head (kernels/cpu/greedy_head.py)
where it is installed: the same tokens as the full fp32 head, and every row that needs
more of its logits than their argmax still gets them."""
import pytest

from gpu_worker import LLM, SamplingParams
from kernels.cpu import greedy_head

pytestmark = pytest.mark.skipif(not greedy_head.available(), reason="the screen needs the C kernels' AVX2 or AVX-512 path")

PROMPTS = [[1, 500 + 7 * i, 900 + i, 40 + 3 * i] * (1 + i % 4) for i in range(12)]


def counting_full_head(llm):
    model, calls = llm.engine.model, []
    full = model.compute_logits

    def compute_logits(hidden):
        calls.append(hidden.shape[0])
        return full(hidden)

    model.compute_logits = compute_logits
    return calls


def test_greedy_tokens_are_those_of_the_full_head(tiny_llama_dir):
    params = [SamplingParams(temperature=0, max_tokens=12 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    screened = LLM(tiny_llama_dir, kv_cache_memory=16 << 20)
    full = LLM(tiny_llama_dir, kv_cache_memory=16 << 20, greedy_screen=False)
    head = screened.engine.model.greedy_head
    assert head is not None and full.engine.model.greedy_head is None
    calls, decided, argmax = counting_full_head(screened), [], head.argmax

    def counting_argmax(x):
        tokens = argmax(x)
        if tokens is not None:
            decided.append(x.shape[0])
        return tokens

    head.argmax = counting_argmax
    got = [o.token_ids for o in screened.generate(PROMPTS, params)]
    assert got == [o.token_ids for o in full.generate(PROMPTS, params)]
    # Every step's rows were greedy: the screen decided each step of up to max_rows rows (all
    # of them with AVX-512's bf16 pass; on AVX2, up to AVX2_SCREEN_ROWS), the full head only the larger.
    limit = head.max_rows or len(PROMPTS)
    assert decided and max(decided) <= limit
    assert all(n > limit for n in calls)


def test_rows_that_need_the_logits_get_them(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, kv_cache_memory=16 << 20)
    calls = counting_full_head(llm)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    sampled = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True, seed=3)
    penalised = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, repetition_penalty=1.3)
    outs = llm.generate(PROMPTS[:4], [greedy, with_logprobs, sampled, penalised])
    assert all(len(o.token_ids) == 6 for o in outs)
    assert len(calls) >= 6 and max(calls) == 4   # a step with any such row computes the whole head
    assert outs[1].logprobs is not None and len(outs[1].logprobs) == 6
    alone = LLM(tiny_llama_dir, kv_cache_memory=16 << 20, greedy_screen=False)
    assert outs[0].token_ids == alone.generate([PROMPTS[0]], [greedy])[0].token_ids
    assert outs[1].token_ids == alone.generate([PROMPTS[1]], [with_logprobs])[0].token_ids


def test_only_an_f32_packed_head_is_screened(tiny_llama_dir):
    assert LLM(tiny_llama_dir, kv_cache_memory=16 << 20, onednn=False).engine.model.greedy_head is None
    assert LLM(tiny_llama_dir, kv_cache_memory=16 << 20, quantization="int8+head").engine.model.greedy_head is None
    assert LLM(tiny_llama_dir, kv_cache_memory=16 << 20, quantization="int8").engine.model.greedy_head is not None


def test_a_mixed_batch_gives_each_row_its_own_token(tiny_llama_dir):
    # Greedy and sampled rows interleaved in one batch: each gets its own token, as without
    # the screen (such steps compute the whole head: screening the greedy rows beside it
    # measured no faster, a second weight stream for little compute saved).
    kinds = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True) if i % 3 else
             SamplingParams(temperature=0.7, max_tokens=8, ignore_eos=True, seed=i) for i in range(len(PROMPTS))]
    screened = LLM(tiny_llama_dir, kv_cache_memory=16 << 20).generate(PROMPTS, kinds)
    full = LLM(tiny_llama_dir, kv_cache_memory=16 << 20, greedy_screen=False).generate(PROMPTS, kinds)
    assert [o.token_ids for o in screened] == [o.token_ids for o in full]


def test_steps_past_max_rows_compute_the_full_head(tiny_llama_dir):
    # The widened screen (AVX-512 without AVX512_BF16) declines steps of more rows than
    # max_rows, where the full head is as fast: those steps compute it, the rest do not, and
    # every token is the full head's.
    params = [SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True) for i in range(len(PROMPTS))]
    llm = LLM(tiny_llama_dir, kv_cache_memory=16 << 20)
    llm.engine.model.greedy_head.max_rows = 5
    calls = counting_full_head(llm)
    got = [o.token_ids for o in llm.generate(PROMPTS, params)]
    full = LLM(tiny_llama_dir, kv_cache_memory=16 << 20, greedy_screen=False)
    assert got == [o.token_ids for o in full.generate(PROMPTS, params)]
    assert calls and all(n > 5 for n in calls)   # the steps of 6-12 rows, and only those
