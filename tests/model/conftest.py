# Share the engine tests' tiny models and transformers reference.
from tests.engine.conftest import hf_reference, tiny_llama_dir, tiny_qwen_dir  # noqa: F401
