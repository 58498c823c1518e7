"""Where ``ops/bench/install_peers.sh`` put the peers of ``fleet bench peers``, and whether
each is there: a missing one is reported with a one-line hint, never an error."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "install it with ops/bench/install_peers.sh"
GGUF_STEM = "SmolLM2-135M-Instruct"


def peers_dir() -> Path:
    """``$FLEET_PEERS_DIR``, else ``~/.cache/redis-llm-fleet/peers`` (install_peers.sh's prefix)."""
    return Path(os.environ.get("FLEET_PEERS_DIR") or Path.home() / ".cache" / "redis-llm-fleet" / "peers")


@dataclass(frozen=True)
class Found:
    """A peer's paths, or ``missing``: why it cannot run (a one-line hint)."""
    name: str
    paths: dict[str, Path] = field(default_factory=dict)
    missing: str | None = None

    @property
    def ok(self) -> bool:
        return self.missing is None


def find_vllm(root: Path | None = None) -> Found:
    """vLLM's venv Python and the LD_PRELOAD list (tcmalloc:libiomp5) the installer recorded."""
    root = root or peers_dir()
    python, preload = root / "vllm-venv" / "bin" / "python", root / "vllm-preload.txt"
    if not python.exists():
        return Found("vllm", missing=f"vLLM CPU not found at {python.parent.parent}: {INSTALL_HINT} vllm")
    if not preload.exists():
        return Found("vllm", missing=f"{preload} missing (tcmalloc, libiomp5): {INSTALL_HINT} vllm")
    libs = [p for p in preload.read_text().strip().split(":") if p]
    absent = [p for p in libs if not Path(p).exists()]
    if absent or not libs:
        return Found("vllm", missing=f"preload libraries {absent or libs} missing: {INSTALL_HINT} vllm")
    return Found("vllm", {"python": python, "preload": preload})


def find_llama(root: Path | None = None, formats: tuple[str, ...] = ("F32", "Q4_1")) -> Found:
    """llama.cpp's binaries and one GGUF per format (``F32``, ``Q8_0``, ``Q4_K_M``, ``Q4_1``)."""
    root = root or peers_dir()
    bin_dir = root / "llama.cpp" / "build" / "bin"
    paths = {tool: bin_dir / tool for tool in ("llama-server", "llama-perplexity")}
    if not paths["llama-server"].exists():
        return Found("llama.cpp", missing=f"llama-server not found in {bin_dir}: {INSTALL_HINT} llama")
    for fmt in formats:
        gguf = gguf_path(root, fmt)
        if not gguf.exists():
            return Found("llama.cpp", missing=f"{gguf} missing: {INSTALL_HINT} gguf")
        paths[fmt] = gguf
    return Found("llama.cpp", paths)


def find_llama_bindings(root: Path | None = None) -> Found:
    """The ``llama-py`` venv's Python (llama-cpp-python's bindings) and the libllama.so folder."""
    root = root or peers_dir()
    python, lib_dir = root / "llama-py" / "bin" / "python", root / "llama.cpp" / "build" / "bin"
    if not python.exists() or not any(lib_dir.glob("libllama.so*")):
        return Found("llama-cpp-python", missing=f"llama.cpp bindings not found at {python.parent.parent}: "
                     f"{INSTALL_HINT} llama")
    return Found("llama-cpp-python", {"python": python, "lib_dir": lib_dir})


def gguf_path(root: Path, fmt: str) -> Path:
    """The GGUF file of one format, as install_peers.sh names it."""
    return root / "gguf" / f"{GGUF_STEM}-{fmt}.gguf"


def vllm_env(found: Found, threads: int) -> dict[str, str]:
    """The environment vLLM's CPU docs ask for: tcmalloc and Intel OpenMP preloaded, KV cache
    space in GiB, OpenMP threads bound to cores 0..threads-1."""
    preload = found.paths["preload"].read_text().strip()
    return {"LD_PRELOAD": preload, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "OMP_NUM_THREADS": str(threads), "VLLM_TARGET_DEVICE": "cpu",
            # its engine process talks to the front over ZMQ: keep that on loopback
            "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1"}


def versions(root: Path | None = None) -> str:
    """What install_peers.sh recorded of the peers' versions (empty when nothing is installed)."""
    path = (root or peers_dir()) / "versions.txt"
    return path.read_text().strip() if path.exists() else ""
