import pytest
import torch


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory):
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), "qwen2", seed=1, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def hf_reference():
    """greedy(model_dir, prompt_ids, n) -> n token ids from transformers ``generate``."""
    from transformers import AutoModelForCausalLM

    models = {}

    @torch.inference_mode()
    def greedy(model_dir, ids, n, stop_at_eos=False):
        if model_dir not in models:
            models[model_dir] = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        m = models[model_dir]
        kwargs = {} if stop_at_eos else {"eos_token_id": None, "min_new_tokens": n}
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs)
        return out[0, len(ids):].tolist()

    return greedy
