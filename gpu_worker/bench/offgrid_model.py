"""A copy of a model with every projection weight moved off the 4-bit grid it may have shipped on.

    python -m gpu_worker.bench.offgrid_model OUT_DIR [--model SRC] [--seed N]

SmolLM2-135M-Instruct reaches this project dequantized from a Q4_1 GGUF, so any 4-bit format
whose groups are Q4_1's (32 input weights, a scale and a minimum) finds the shipped weights
again and looks lossless on it. Here each projection weight w becomes w + u, u uniform on
[-s/2, s/2), s = the Q4_1 step of w's group of 32 ((max - min) / 15): w mod s is then uniform,
so no grid is left to find. Embeddings, the head and the norms are copied unchanged. The
result is another model (its fp32 perplexity differs); both engines' fp32 references are
taken on it, so their quantized formats are compared on equal terms (README, "Quantization
quality against llama.cpp's formats").
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

GROUP = 32


def offgrid(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """w [out, in] (in a multiple of GROUP) plus uniform noise of one Q4_1 step per group."""
    g = w.float().reshape(w.shape[0], -1, GROUP)
    step = (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
    noise = (torch.rand(g.shape, generator=gen) - 0.5) * step
    return (g + noise).reshape(w.shape).to(w.dtype).contiguous()


def write_offgrid_model(src: Path, dst: Path, seed: int = 20261204) -> int:
    """Copies src to dst with every ``*proj.weight`` moved off the grid; returns how many."""
    from safetensors.torch import load_file, save_file

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    # llama.cpp's GGUF converter needs the architecture, which the embedded config leaves out.
    config = json.loads((dst / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"])
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    gen = torch.Generator().manual_seed(seed)
    moved = 0
    for f in files:
        state = load_file(f)
        for name, w in state.items():
            if name.endswith("proj.weight") and w.dim() == 2 and w.shape[1] % GROUP == 0:
                state[name] = offgrid(w, gen)
                moved += 1
        save_file(state, dst / f.name, metadata={"format": "pt"})
    return moved


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpu_worker.bench.offgrid_model", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", type=Path, default=None, help="source model dir (default: the embedded SmolLM2)")
    p.add_argument("--seed", type=int, default=20261204)
    args = p.parse_args(argv)
    if args.model is None:
        from gpu_worker.model.default_model import default_model_dir

        args.model = Path(default_model_dir())
    moved = write_offgrid_model(args.model, args.out, args.seed)
    print(f"{moved} projection weights moved off the 4-bit grid -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
