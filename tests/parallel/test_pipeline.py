"""Two pipeline stages in two processes (gloo on 127.0.0.1) generate exactly what one
stage does: greedy, mixed prompt lengths, chunked prefill, several micro-batches."""
import random

import pytest

from gpu_worker import LLM, SamplingParams
from gpu_worker.parallel.pipeline import PipelineOptions, generate_pipelined
from gpu_worker.parallel.stage import split_layers


def test_split_layers_is_contiguous_and_even():
    assert split_layers(3, 2) == [(0, 2), (2, 3)]
    assert split_layers(30, 4) == [(0, 8), (8, 16), (16, 23), (23, 30)]
    with pytest.raises(ValueError):
        split_layers(2, 3)


@pytest.fixture(scope="module")
def three_layer_model(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-3l"), "llama", seed=3, num_layers=3)


def test_two_stage_pipeline_output_equals_single_stage(three_layer_model):
    rng = random.Random(11)
    prompts = [[rng.randrange(100, 48000) for _ in range(n)] for n in (3, 17, 40, 9, 25)]
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=4 + 3 * i) for i in range(len(prompts))]
    single = LLM(three_layer_model, kv_cache_memory=16 << 20, max_num_batched_tokens=32, block_size=8)
    expected = [o.token_ids for o in single.generate(prompts, params)]
    opts = PipelineOptions(num_stages=2, num_microbatches=2, block_size=8, num_blocks=64,
                           max_num_batched_tokens=32, timeout_s=240)
    outs = generate_pipelined(three_layer_model, prompts, params, opts)
    assert [o["token_ids"] for o in outs] == expected
    assert all(o["finish_reason"] == "length" for o in outs)
