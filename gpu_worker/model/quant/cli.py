"""``fleet quantize``: calibrate and quantize a model now and keep it in the cache, so that
workers started later with the same ``--quantization`` load it in about a second (run it in
an image build or an init container, with ``FLEET_CACHE_DIR`` on a volume the workers mount)."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model dir or .gguf (default: embedded SmolLM2)")
    p.add_argument("--quantization", default="int4", help="int4 (default), int4-g<group>, w8a8 or w8a8-a<group>: the calibrated ones (int8 needs no cache)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")


def run(args: argparse.Namespace) -> int:
    from gpu_worker.config import EngineConfig
    from gpu_worker.model.build import build_model
    from gpu_worker.model.loader import load_model_config, resolve_model_dir
    from gpu_worker.model.quant.cache import cache_path
    from gpu_worker.tokenizer import Tokenizer

    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, quantization=args.quantization)
    model_dir = resolve_model_dir(config.model)
    cfg = load_model_config(model_dir)
    model = build_model(config, cfg, model_dir, cfg.max_position_embeddings, Tokenizer(model_dir))
    path = cache_path(model, args.quantization, model_dir) if config.quant_cache else None
    print(path if path is not None and path.exists() else "not cached (the cache is off, or a weight-only int8 spec: no cache needed)")
    return 0
