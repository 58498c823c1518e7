"""The engine side of the ``fleet`` command: ``worker``, ``quantize`` and ``bench ...``.

``producer.cli`` is the front door and hands these sub-commands over lazily, so the
producer side installs and runs without torch. Each sub-command lives in its own module
exposing ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from shared import cliargs, logs

# sub-command path -> (module, help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("worker",): ("gpu_worker.edge.cli", "run a worker: pull requests from Redis, stream tokens back"),
    ("quantize",): ("gpu_worker.model.quant.cli", "calibrate + quantize a model once, into the cache"),
    ("bench", "throughput"): ("gpu_worker.bench.throughput", "engine vs transformers, in-process"),
    ("bench", "e2e"): ("gpu_worker.edge.bench_e2e", "the fleet through Redis vs the in-process engine"),
    ("bench", "spec"): ("gpu_worker.bench.spec", "speculative decoding proposers, side by side"),
    ("bench", "quant"): ("gpu_worker.bench.quant_quality", "INT8/INT4 weight-only quantization vs fp32"),
    ("bench", "peers"): ("gpu_worker.bench.peers", "this engine vs vLLM CPU and llama.cpp on the same CPU (ops/bench/install_peers.sh)"),
    ("bench", "formats"): ("gpu_worker.bench.formats", "decode tokens/s of fp32, bf16, int8, int4 weights at batch 1, 8, 64"),
    ("bench", "linear"): ("gpu_worker.bench.linear", "CPU matmuls: torch vs oneDNN-packed, per model shape"),
    ("bench", "cpu-attention"): ("gpu_worker.bench.cpu_attention", "CPU attention: C kernels vs gather + SDPA"),
    ("bench", "soak"): ("gpu_worker.bench.soak", "the fleet under kill -9, SIGSTOP and Redis restarts; every token counted"),
    ("bench", "edge"): ("gpu_worker.bench.edge", "Redis CPU per streamed token through the real edge: single vs cluster, before vs after the cuts"),
}
ENGINE_COMMANDS = frozenset(path[0] for path in COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = cliargs.Parser(prog="fleet")
    cliargs.add_version(parser)
    top = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, (module_name, help_text) in COMMANDS.items():
        if len(path) > 1 and path[0] not in groups:
            group = top.add_parser(path[0], help=f"{path[0]} sub-commands")
            groups[path[0]] = group.add_subparsers(dest="subcommand", required=True)
        sub = (top if len(path) == 1 else groups[path[0]]).add_parser(path[-1], help=help_text)
        sub.set_defaults(_module=module_name)
        _add_arguments_lazily(sub, module_name)
    return parser


def _add_arguments_lazily(sub: argparse.ArgumentParser, module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            sub.description = "(not available in this build)"
            return
        raise
    module.add_arguments(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure_from(args)  # --log-format/--log-level where the command has them, else env
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
