"""EngineCore: add requests, step, read deltas. Synchronous; no IO, no Redis, one thread."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from gpu_worker.config import EngineConfig
from gpu_worker.cpu_tuning import tune_allocator
from gpu_worker.detokenizer import IncrementalDetokenizer
from gpu_worker.errors import INTERNAL, InvalidRequestError
from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.model.build import build_model, kv_budget_bytes, kv_bytes_per_token, torch_dtype
from gpu_worker.model.loader import load_model_config, resolve_model_dir
from gpu_worker.outputs import RequestDelta
from gpu_worker.postprocess import apply_step
from gpu_worker.recovery import rerun_in_halves
from gpu_worker.request import Request
from gpu_worker.runner import ModelRunner
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import Scheduler
from gpu_worker.spec.build import build_speculator
from gpu_worker.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["EngineCore", "EngineConfig"]

# Different requests failing alone one after another, with no step running in between,
# say the engine is broken, not the requests.


class EngineCore:
    """Owns the model, the KV cache, the scheduler. Not thread-safe: call every method
    from one thread."""

    def __init__(self, config: EngineConfig) -> None:
        tune_allocator()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        t0 = time.perf_counter()
        self.model_dir = resolve_model_dir(config.model)
        self.model_config = cfg = load_model_config(self.model_dir)
        self.tokenizer = Tokenizer(self.model_dir)
        self.vocab_size = cfg.vocab_size
        self.max_model_len = min(config.max_model_len or cfg.max_position_embeddings,
                                 cfg.max_position_embeddings)
        self.device = torch.device(config.device)
        self.model = build_model(config, cfg, self.model_dir, self.max_model_len, self.tokenizer)
        dtype = torch_dtype(config.dtype)
        per_block = config.block_size * kv_bytes_per_token(cfg, dtype)
        budget = kv_budget_bytes(config)
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"KV-cache memory {budget} B is less than one block ({per_block} B)")
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_num_seqs=config.max_num_seqs)
        self.runner = ModelRunner(self.model, num_blocks, config.block_size, seed=config.seed,
                                  device=self.device, dtype=dtype)
        if self.device.type == "cuda":
            from gpu_worker.model.cuda_graphs import capture_decode_graphs

            self.runner.graphs = capture_decode_graphs(self.model, self.runner.kv_caches,
                                                       max_num_seqs=config.max_num_seqs,
                                                       max_model_len=self.max_model_len,
                                                       block_size=config.block_size)
        self.speculator = build_speculator(config, self.model, self.runner, self.kv, num_blocks, self.tokenizer,
                                           self.model_dir)
        self.num_steps = 0
        self.num_failed_alone = 0  # consecutive requests failed alone, no step ran since
        logger.info("engine ready in %.1fs: %s, %d layers, %d KV blocks of %d tokens (%.0f MiB), %s %s%s",
                    time.perf_counter() - t0, self.model_dir.name, cfg.num_layers, num_blocks,
                    config.block_size, num_blocks * per_block / 2**20, self.device, config.dtype,
                    f", {config.quantization}" if config.quantization else "")

    # -- requests ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, *,
                    priority: int = 0, resume_token_ids: Sequence[int] = (),
                    deadline: float | None = None) -> None:
        """Queue a request; raises :class:`InvalidRequestError` for bad input (nothing queued)."""
        prompt, resumed = list(prompt_token_ids), list(resume_token_ids)
        self._validate(request_id, prompt, resumed, params)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        if resumed:
            detok.prime(resumed)
        req = Request(request_id=request_id, prompt_token_ids=prompt, params=params,
                      detokenizer=detok, eos_token_ids=self.model_config.eos_token_ids,
                      max_total_tokens=self.max_model_len, priority=priority, deadline=deadline,
                      num_resumed_tokens=len(resumed), output_token_ids=resumed)
        self.scheduler.add_request(req)

    def _validate(self, request_id: str, prompt: list[int], resumed: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("invalid_params", "params must be a SamplingParams")
        if request_id in self.scheduler.requests:
            raise InvalidRequestError("duplicate_request_id", f"request {request_id!r} is already running")
        if not prompt:
            raise InvalidRequestError("empty_prompt", "the prompt has no tokens")
        params.validate(self.vocab_size)
        if len(prompt) + len(resumed) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt_too_long", f"prompt of {len(prompt) + len(resumed)} tokens does not fit the "
                f"model's context of {self.max_model_len} tokens (one token must remain to generate)")
        bad = next((t for t in prompt + resumed if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError("invalid_token_id", f"token id {bad!r} is outside [0, {self.vocab_size})")
        if len(resumed) >= params.max_tokens:
            raise InvalidRequestError("invalid_resume", "resumed tokens already reach max_tokens")
        total = len(prompt) + min(params.max_tokens, self.max_model_len - len(prompt))
        if self.kv.blocks_for(total) > self.kv.num_total_blocks:
            raise InvalidRequestError("exceeds_kv_cache", f"{total} tokens can never fit this worker's KV cache")

    def abort_request(self, request_id: str, reason: str = "cancelled") -> bool:
        """End a request now (blocks freed); its final delta comes with the next step()."""
        return self.scheduler.abort(request_id, reason)

    # -- the loop -------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        """One schedule -> execute -> update. A request that fails alone ends with
        ``finish_reason="error"``; raises :class:`EngineBrokenError` when steps fail
        whatever they hold (every request is then left as it was, for a hand-back)."""
        sched_out = self.scheduler.schedule()
        t0 = time.perf_counter()
        try:
            run_out = self.runner.execute(sched_out)
            self.num_failed_alone = 0
        except Exception as exc:  # the batch failed as a whole: find out whose fault it is
            run_out = rerun_in_halves(self, sched_out.scheduled, exc)
        elapsed = time.perf_counter() - t0
        self.num_steps += 1
        deltas = apply_step(self.scheduler, sched_out, run_out)
        if self.speculator is not None:
            self._speculate(sched_out.num_batched_tokens, elapsed, run_out, deltas)
        return deltas

    def _speculate(self, num_tokens: int, elapsed: float, run_out, deltas: list[RequestDelta]) -> None:
        spec = self.speculator
        spec.observe_step(num_tokens, elapsed)
        spec.record(run_out.num_drafted, run_out.num_accepted)
        for d in deltas:
            if d.finished:
                spec.forget(d.request_id)
        for req, exc in spec.propose(self.scheduler.running, self.max_model_len):
            self.scheduler.fail(req, INTERNAL, f"drafting failed: {exc!r}")   # reported next step

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def unfinished_request_ids(self) -> list[str]:
        """Every request whose final delta has not been returned yet (for a hand-back)."""
        return list(self.scheduler.requests) + [r.request_id for r in self.scheduler.finished]

    # -- admission and stats --------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.kv.num_total_blocks

    def can_admit(self, num_prompt_tokens: int, max_tokens: int) -> bool:
        total = num_prompt_tokens + min(max_tokens, max(self.max_model_len - num_prompt_tokens, 0))
        return self.scheduler.can_admit(total)

    def stats(self) -> dict:
        kv = self.kv
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_free_blocks": kv.num_free_blocks,
            "num_total_blocks": kv.num_total_blocks,
            "kv_usage": kv.usage,
            "prefix_cache_queries": kv.prefix_queries,
            "prefix_cache_hits": kv.prefix_hits,
            "prefix_cache_hit_rate": kv.prefix_hits / kv.prefix_queries if kv.prefix_queries else 0.0,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.num_steps,
            **(self.speculator.stats() if self.speculator else {}),
        }
