"""Pipeline-parallel generation: layers split into stages, one process (and device) each.

Rank 0 is the driver and the first stage. It runs ``num_microbatches`` *virtual engines*
(vLLM's name): each has its own scheduler, KV-block pool and requests, so their steps are
independent. Rank 0 schedules engine v, runs its layers, sends the activations down the
pipeline and moves on to engine v+1 while later stages work on v; the last stage sends the
logits of v's sampled rows back, and rank 0 samples and updates v before scheduling it
again. With as many micro-batches as stages every stage is busy in the steady state.

Each stage holds only its layers' weights and, per virtual engine, only their KV caches.
Sampling happens on rank 0 with the engine's own sampler, so greedy output is the same as
single-stage output. On the CPU the stages talk over gloo on 127.0.0.1 (a free port chosen
by the OS); on GPUs, one device per stage, over NCCL.

    outs = generate_pipelined(model_dir, prompt_token_ids, SamplingParams(temperature=0))
"""
from __future__ import annotations

import logging
import os
import multiprocessing as mp
from dataclasses import dataclass, field

import torch

from gpu_worker.config import switched_on
from gpu_worker.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineOptions:
    num_stages: int = 2
    num_microbatches: int | None = None      # default: num_stages
    devices: tuple[str, ...] | None = None   # one per stage; default cpu (or cuda:i when available)
    block_size: int = 16
    num_blocks: int = 256                    # per virtual engine
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 32
    max_model_len: int | None = None
    threads_per_stage: int = 1
    timeout_s: float = 300.0
    # The same switches as EngineConfig's, read from the same environment defaults once.
    ops_backend: str = field(default_factory=lambda: os.environ.get("FLEET_OPS") or "auto")
    cpu_kernels: bool = field(default_factory=lambda: switched_on("FLEET_CPU_KERNELS"))
    huge_pages: bool = field(default_factory=lambda: switched_on("FLEET_HUGE_PAGES"))   # the KV caches'


@dataclass
class _Engine:
    scheduler: object
    runner: object


def _stage_devices(opts: PipelineOptions) -> list[str]:
    if opts.devices is not None:
        if len(opts.devices) != opts.num_stages:
            raise ValueError("one device per stage")
        return list(opts.devices)
    if torch.cuda.is_available() and torch.cuda.device_count() >= opts.num_stages:
        return [f"cuda:{i}" for i in range(opts.num_stages)]
    return ["cpu"] * opts.num_stages


def generate_pipelined(model_dir: str, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                       opts: PipelineOptions = PipelineOptions()) -> list[dict]:
    """Run every prompt through an ``opts.num_stages``-stage pipeline in fresh processes;
    returns per prompt ``{"token_ids", "text", "finish_reason"}`` in prompt order."""
    import torch.distributed as dist

    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    devices = _stage_devices(opts)
    store = dist.TCPStore("127.0.0.1", 0, opts.num_stages, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_stage_main, daemon=True,
                         args=(rank, store.port, devices, str(model_dir), opts, prompts, plist, results))
             for rank in range(opts.num_stages)]
    for p in procs:
        p.start()
    try:
        status, payload = results.get(timeout=opts.timeout_s)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if status != "ok":
        raise RuntimeError(f"pipeline failed: {payload}")
    return payload


def _stage_main(rank, port, devices, model_dir, opts, prompts, plist, results) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(opts.threads_per_stage)
        device = torch.device(devices[rank])
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, len(devices), is_master=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=len(devices))
        try:
            out = _drive(model_dir, opts, device, prompts, plist) if rank == 0 else _serve(
                model_dir, opts, device, rank)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            results.put(("ok", out))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        logger.exception("stage %d failed", rank)
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def _setup(model_dir: str, opts: PipelineOptions, device: torch.device, rank: int):
    from gpu_worker.model.loader import load_model_config, resolve_model_dir
    from gpu_worker.model.ops.backends import select_ops
    from gpu_worker.parallel.stage import StageSpec, build_stage_model, split_layers

    path = resolve_model_dir(model_dir)
    cfg = load_model_config(path)
    start, end = split_layers(cfg.num_layers, opts.num_stages)[rank]
    spec = StageSpec(rank, opts.num_stages, start, end)
    max_len = min(opts.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    model = build_stage_model(path, cfg, spec, select_ops(device, opts.ops_backend, cpu_kernels=opts.cpu_kernels),
                              max_len, device)
    return path, cfg, spec, model, max_len


def _serve(model_dir: str, opts: PipelineOptions, device: torch.device, rank: int) -> None:
    """A non-first stage: receive a micro-batch, run its layers, pass it on (or return the
    logits to rank 0), until told to stop."""
    from gpu_worker.parallel import comm
    from gpu_worker.parallel.stage import run_stage
    from gpu_worker.runner import allocate_kv_caches

    _, cfg, spec, model, _ = _setup(model_dir, opts, device, rank)
    dtype = model.layers[0].input_norm.dtype
    caches = [allocate_kv_caches(model.cfg, opts.num_blocks, opts.block_size, torch.float32, device,
                                 huge_pages=opts.huge_pages)
              for _ in range(opts.num_microbatches or opts.num_stages)]
    while (batch := comm.recv_batch(rank - 1, cfg.hidden_size, dtype, device)) is not None:
        plan = model.ops.plan_attention(batch.meta)
        out = run_stage(model, spec, batch.acts[0], batch.acts[1], None, batch.positions,
                        caches[batch.engine], plan, batch.logit_rows)
        if spec.is_last:
            if batch.logit_rows.numel():
                comm.send_logits(out.float(), batch.engine)
        else:
            for work, _ in comm.send_batch(rank + 1, batch.engine, batch.positions, batch.meta,
                                           batch.logit_rows, *out):
                work.wait()
    if not spec.is_last:
        comm.send_stop(rank + 1, device)


def _drive(model_dir: str, opts: PipelineOptions, device: torch.device, prompts, plist) -> list[dict]:
    from gpu_worker.kv_cache import KVCacheManager
    from gpu_worker.request import RequestFactory
    from gpu_worker.runner import ModelRunner, allocate_kv_caches
    from gpu_worker.scheduler import Scheduler
    from gpu_worker.tokenizer import Tokenizer

    path, cfg, spec, model, max_len = _setup(model_dir, opts, device, 0)
    # The engine's own intake: bad input raises InvalidRequestError before anything runs.
    factory = RequestFactory(Tokenizer(path), cfg.eos_token_ids, cfg.vocab_size, max_len,
                             opts.num_blocks * opts.block_size)
    requests = [factory.make(str(i), ids, p) for i, (ids, p) in enumerate(zip(prompts, plist))]
    engines = []
    for _ in range(opts.num_microbatches or opts.num_stages):
        kv = KVCacheManager(opts.num_blocks, opts.block_size)
        caches = allocate_kv_caches(model.cfg, opts.num_blocks, opts.block_size, torch.float32, device,
                                    huge_pages=opts.huge_pages)
        engines.append(_Engine(Scheduler(kv, max_num_batched_tokens=opts.max_num_batched_tokens,
                                         max_num_seqs=opts.max_num_seqs),
                               ModelRunner(model, caches, opts.block_size)))
    for i, req in enumerate(requests):
        engines[i % len(engines)].scheduler.add_request(req)   # round robin: micro-batches about equal
    outputs = {str(i): {"token_ids": [], "text": "", "finish_reason": None} for i in range(len(prompts))}
    _pipeline_loop(engines, model, spec, cfg, device, outputs)
    return [outputs[str(i)] for i in range(len(prompts))]


def _pipeline_loop(engines: list[_Engine], model, spec, cfg, device, outputs: dict) -> None:
    from gpu_worker.parallel import comm
    from gpu_worker.parallel.stage import run_stage
    from gpu_worker.runner import RunnerOutput

    last = spec.num_stages - 1
    in_flight: dict[int, tuple] = {}
    num_steps = 0
    while in_flight or any(e.scheduler.has_unfinished() for e in engines):
        for v, eng in enumerate(engines):
            if v in in_flight:   # this engine's previous micro-batch is back: sample and update
                sched_out, batch, recv, sends = in_flight.pop(v)
                run_out = RunnerOutput()
                if recv is not None:
                    recv[0].wait()
                    eng.runner.sample(batch, recv[1].cpu(), run_out)
                for work, _ in sends:
                    work.wait()
                for delta in eng.scheduler.update_from_output(sched_out, run_out):
                    out = outputs[delta.request_id]
                    out["token_ids"] += delta.new_token_ids
                    out["text"] += delta.new_text
                    out["finish_reason"] = delta.finish_reason if delta.finished else None
            if not eng.scheduler.has_unfinished():
                continue
            sched_out = eng.scheduler.schedule()
            if not sched_out.scheduled:
                in_flight[v] = (sched_out, None, None, [])
                continue
            batch = eng.runner.prepare(sched_out)
            rows = batch.logits_index     # [num_logits_rows]: what the last stage returns logits for
            x, residual = run_stage(model, spec, None, None, batch.input_ids, batch.positions,
                                    eng.runner.kv_caches, model.ops.plan_attention(batch.meta), None)
            sends = comm.send_batch(1, v, batch.positions, batch.meta, rows, x, residual)
            recv = comm.post_logits_recv(last, v, len(rows), cfg.vocab_size, device) if len(rows) else None
            in_flight[v] = (sched_out, batch, recv, sends)
            num_steps += 1
    comm.send_stop(1, device)
    logger.info("pipeline: %d micro-batch steps over %d virtual engines", num_steps, len(engines))
