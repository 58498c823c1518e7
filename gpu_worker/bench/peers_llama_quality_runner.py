"""llama.cpp's side of ``fleet bench peers --quality``, run by the Python of install_peers.sh's
``llama-py`` venv (llama-cpp-python's ctypes bindings on the libllama.so it built):

    LLAMA-PY/bin/python peers_llama_quality_runner.py JOB.json OUT.json

For each GGUF: free-running greedy outputs (argmax of llama.cpp's logits, token by token)
of the job's token-id prompts, and the perplexity of the job's text ids computed as
``quant_quality.perplexity`` does: one teacher-forced pass, the logits of every position,
exp of the mean cross-entropy of each next token. Nothing is tokenized here.
"""
from __future__ import annotations

import json
import sys

import numpy as np
from llama_cpp import Llama

GGML_TYPE_F32 = 0


def load(path: str, threads: int) -> Llama:
    """A context with the logits of every position; f32 KV cache for an F32 GGUF."""
    kv = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if "F32" in path else {}
    return Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads,
                 logits_all=True, verbose=False, **kv)


def greedy(llm: Llama, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out


def perplexity(llm: Llama, ids: list[int]) -> float:
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(ids) - 1), ids[1:]].mean()
    return float(np.exp(nll))


def main() -> int:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    result = {}
    for fmt, path in job["ggufs"].items():
        llm = load(path, job["threads"])
        result[fmt] = {"outputs": [greedy(llm, p, job["tokens"]) for p in job["prompts"]],
                       "perplexity": perplexity(llm, job["text_ids"])}
        del llm
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
