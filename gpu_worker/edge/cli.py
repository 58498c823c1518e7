"""``fleet worker``: serve one model's request streams from Redis until SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os

from gpu_worker.config import DTYPES, OPS_BACKENDS, EngineConfig, resolve_dtype
from gpu_worker.edge.options import WorkerOptions
from shared import logs

logger = logging.getLogger(__name__)


def default_redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def add_engine_arguments(parser: argparse.ArgumentParser):
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="HF model dir or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--kv-cache-memory", default=None,
                   help="bytes for the KV cache, e.g. 512MiB (default: a share of free memory)")
    e = EngineConfig()
    g.add_argument("--max-num-seqs", type=int, default=e.max_num_seqs,
                   help="the most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=int, default=e.max_num_batched_tokens,
                   help="token budget of one engine step (prefill chunks + decodes + drafts)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="cap on prompt + output tokens; longer prompts fail with "
                        "prompt_too_long (default: the model's max positions)")
    g.add_argument("--block-size", type=int, default=e.block_size, help="tokens per KV block")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (cuda uses the Triton kernels)")
    g.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    g.add_argument("--speculative", choices=("ngram", "draft", "self"), default=None,
                   help="speculative decoding proposer (default: off)")
    g.add_argument("--num-speculative-tokens", type=int, default=e.num_speculative_tokens,
                   help="the most drafted tokens per request per step")
    g.add_argument("--draft-model", default=None, help="draft model dir for --speculative draft")
    g.add_argument("--self-draft-layers", type=int, default=None,
                   help="early-exit layer for --speculative self (default: a quarter of the layers)")
    g.add_argument("--self-draft-quantization", choices=("int8", "int4"), default=None,
                   help="--speculative self drafts with the target's own weights quantized (GPU)")
    g.add_argument("--quantization", type=_quantization_spec, default=None, metavar="SPEC",
                   help="weight-only quantization at load: int8 (per channel), int8-g<G>, int4 "
                        "(group 32, calibrated), int4-g<G>; +head quantizes the LM head too (int8); "
                        "w8a8: int8 per channel with activations quantized per row to int8 (CPU, AVX512_VNNI or AVX2; "
                        "calibrated smoothing scales, cached like int4's; changes numerics); w8a8-a<G>: one "
                        "activation scale per G input features, as llama.cpp's Q8 activations")
    g.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights and KV cache dtype; auto: the fastest exact one for the "
                        "device: bfloat16 on CUDA, float32 on the CPU; bfloat16 on the CPU stores "
                        "only the matmul weights in bf16 (default: auto)")
    g.add_argument("--ops-backend", choices=OPS_BACKENDS, default=None,
                   help="compute ops: cpu (C kernels), torch, triton (default: $FLEET_OPS, else auto)")
    return g


def _quantization_spec(spec: str) -> str:
    """--quantization's value, checked by the quantizer's own parser."""
    from gpu_worker.model.quant.quantize import parse_method

    try:
        parse_method(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser).add_argument(
        "--seed", dest="engine_seed", metavar="SEED", type=int, default=EngineConfig().seed,
        help="the engine sampler's seed (requests without their own seed)")
    d = WorkerOptions(worker_id="x")
    g = parser.add_argument_group("redis")
    g.add_argument("--redis-url", default=default_redis_url(),
                   help="redis:// or rediss:// URL, ACL user in it (default: $REDIS_URL)")
    g.add_argument("--model-name", default=d.model_name, help="stream namespace served")
    g.add_argument("--worker-id", default=None, help="consumer name (default: host-pid-random)")
    g.add_argument("--lanes", default=",".join(d.lanes), help="lanes, highest priority first")
    g.add_argument("--local-queue", type=int, default=d.local_queue)
    g.add_argument("--block-ms", type=int, default=d.block_ms)
    g.add_argument("--claim-idle-ms", type=int, default=d.claim_idle_ms)
    g.add_argument("--max-deliveries", type=int, default=d.max_deliveries)
    g.add_argument("--result-ttl-s", type=int, default=d.result_ttl_s)
    g.add_argument("--drain-grace-s", type=float, default=d.drain_grace_s)
    g.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s)
    g.add_argument("--stream-interval-ms", type=int, default=d.stream_interval_ms,
                   help="publish a request's tokens at most once per this interval, several "
                        "per event (0: every engine step; first token and result never wait)")
    g.add_argument("--tenants-refresh-s", type=float, default=d.tenants_refresh_s,
                   help="how often the tenant registry is re-read")
    g.add_argument("--no-legacy-streams", action="store_true",
                   help="stop draining the pre-tenant shared streams (once they are empty)")
    g = parser.add_argument_group("operations")  # ops: metrics and probes
    g.add_argument("--metrics-port", type=int, default=0,
                   help="serve /metrics, /healthz, /readyz on this port (0: off)")
    g.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics port binds")
    g.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between 'engine stats' log lines (0: none)")
    logs.add_arguments(g)


def engine_config(args: argparse.Namespace):
    """The engine's config from the options of :func:`add_engine_arguments`."""
    from gpu_worker.config import parse_bytes

    kv = None if args.kv_cache_memory is None else parse_bytes(str(args.kv_cache_memory))
    ops = {} if args.ops_backend is None else {"ops_backend": args.ops_backend}  # unset: the config's default
    return EngineConfig(model=args.model, kv_cache_memory=kv, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        block_size=args.block_size, num_threads=args.threads, device=args.device,
                        enable_prefix_caching=not args.no_prefix_caching, speculative=args.speculative,
                        num_speculative_tokens=args.num_speculative_tokens, draft_model=args.draft_model,
                        self_draft_layers=args.self_draft_layers,
                        self_draft_quantization=args.self_draft_quantization,
                        quantization=args.quantization, dtype=resolve_dtype(args.dtype, args.device),
                        max_model_len=args.max_model_len,
                        seed=getattr(args, "engine_seed", 0), **ops)  # --seed: only `fleet worker` has it


def worker_options(args: argparse.Namespace) -> WorkerOptions:
    extra = {} if args.worker_id is None else {"worker_id": args.worker_id}
    return WorkerOptions(
        redis_url=args.redis_url, model_name=args.model_name,
        lanes=tuple(x for x in args.lanes.split(",") if x), local_queue=args.local_queue,
        block_ms=args.block_ms, claim_idle_ms=args.claim_idle_ms,
        max_deliveries=args.max_deliveries, result_ttl_s=args.result_ttl_s,
        drain_grace_s=args.drain_grace_s, heartbeat_s=args.heartbeat_s,
        stream_interval_ms=args.stream_interval_ms,
        tenants_refresh_s=args.tenants_refresh_s, legacy_streams=not args.no_legacy_streams,
        **extra)


def run(args: argparse.Namespace) -> int:
    from gpu_worker.edge.worker import Worker
    from gpu_worker.engine import EngineCore
    from gpu_worker.health import serve_http
    from gpu_worker.metrics import WorkerMetrics
    from gpu_worker.worker_log import StatsLogger

    options = worker_options(args)
    metrics = WorkerMetrics(options.model_name, process=True)
    if args.metrics_port:  # up before the model loads: probes answer "loading" meanwhile
        serve_http(metrics, args.metrics_port, args.metrics_host)
    engine = EngineCore(engine_config(args))
    metrics.on_step(0.0, engine.stats())  # the gauges start at the idle engine's values
    worker = Worker(engine, options, metrics)
    StatsLogger(metrics.registry, args.log_stats_interval).start()
    try:
        import uvloop
    except ImportError:  # uvloop is optional on platforms without it
        return asyncio.run(worker.run())
    return uvloop.run(worker.run())
