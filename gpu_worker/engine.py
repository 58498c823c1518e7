"""EngineCore: add requests, step, read deltas. Synchronous; no IO, no Redis, one thread."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from gpu_worker.config import EngineConfig
from gpu_worker.cpu_tuning import tune_allocator
from gpu_worker.errors import INTERNAL
from gpu_worker.kv_cache import KVCacheManager
from gpu_worker.model.build import activation_dtype, build_model, kv_budget_bytes, kv_bytes_per_token
from gpu_worker.model.loader import load_model_config, resolve_model_dir
from gpu_worker.outputs import RequestDelta
from gpu_worker.recovery import GuardedRunner
from gpu_worker.request import RequestFactory
from gpu_worker.runner import ModelRunner, RunnerOutput, allocate_kv_caches
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.scheduler import Scheduler, SchedulerOutput
from gpu_worker.spec.build import build_speculator
from gpu_worker.structured.compiler import GrammarCompiler
from gpu_worker.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

__all__ = ["EngineCore", "EngineConfig"]


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
        dtype = activation_dtype(self.model)   # float32 for a CPU model with bf16 weights
        per_block = config.block_size * kv_bytes_per_token(cfg, dtype)
        budget = kv_budget_bytes(config)
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ValueError(f"KV-cache memory {budget} B is less than one block ({per_block} B)")
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        kv_caches = allocate_kv_caches(cfg, num_blocks, config.block_size, dtype, self.device,
                                       huge_pages=config.huge_pages)
        self.speculator = spec = build_speculator(config, self.model, kv_caches, self.tokenizer, self.model_dir)
        self.scheduler = Scheduler(self.kv, max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_num_seqs=config.max_num_seqs,
                                   num_lookahead_tokens=spec.num_lookahead_tokens if spec else 0)
        self.runner = self._build_runner(kv_caches)
        self.grammars = GrammarCompiler(self.tokenizer.hf, self.vocab_size, cfg.eos_token_ids)
        self.factory = RequestFactory(self.tokenizer, cfg.eos_token_ids, self.vocab_size, self.max_model_len,
                                      num_blocks * config.block_size, self.grammars)
        self.guarded = GuardedRunner(self.runner, self.scheduler, self.factory)
        self.num_steps = 0
        logger.info("engine ready in %.1fs: %s, %d layers, %d KV blocks of %d tokens (%.0f MiB), %s %s%s",
                    time.perf_counter() - t0, self.model_dir.name, cfg.num_layers, num_blocks,
                    config.block_size, num_blocks * per_block / 2**20, self.device, config.dtype,
                    f", {config.quantization}" if config.quantization else "")

    def _build_runner(self, kv_caches: list) -> ModelRunner:
        """The runner, whole: a draft model that observes every batch rules out decode graphs
        (they make no attention plan to show it); otherwise graphs wherever they can run."""
        observe = self.speculator.proposer.observe if self.speculator else None
        graphs = None
        if observe is None and self.device.type == "cuda":
            from gpu_worker.model.cuda_graphs import capture_decode_graphs   # loads Triton: CUDA only

            graphs = capture_decode_graphs(self.model, kv_caches, max_num_seqs=self.config.max_num_seqs,
                                           max_model_len=self.max_model_len, block_size=self.config.block_size)
        return ModelRunner(self.model, kv_caches, self.config.block_size, seed=self.config.seed,
                           graphs=graphs, observe=observe)

    # -- requests ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, *,
                    priority: int = 0, resume_token_ids: Sequence[int] = (),
                    deadline: float | None = None) -> None:
        """Queue a request; raises :class:`InvalidRequestError` for bad input (nothing queued)."""
        self.scheduler.add_request(self.factory.make(request_id, prompt_token_ids, params, priority=priority,
                                                     resume_token_ids=resume_token_ids, deadline=deadline))

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
        run_out = self.guarded.execute(sched_out)
        elapsed = time.perf_counter() - t0
        self.num_steps += 1
        deltas = self.scheduler.update_from_output(sched_out, run_out)
        if self.speculator is not None:
            self._speculate(sched_out, elapsed, run_out, deltas)
        return deltas

    def _speculate(self, sched_out: SchedulerOutput, elapsed: float, run_out: RunnerOutput,
                   deltas: list[RequestDelta]) -> None:
        """Learn from the step, then draft for the next one (through the scheduler)."""
        spec = self.speculator
        if all(s.num_new_tokens == 1 + s.num_spec_tokens for s in sched_out.scheduled):
            # Decode and verification rows only: the step cost that a draft's marginal token
            # adds to. A prefill chunk's tokens cost less each and would skew the fit.
            spec.observe_step(sched_out.num_batched_tokens, elapsed,
                              drafted=any(s.num_spec_tokens for s in sched_out.scheduled))
        spec.record(run_out.num_drafted, run_out.num_accepted)
        for d in deltas:
            if d.finished:
                spec.forget(d.request_id)
        drafts, failed = spec.propose(self.scheduler.decoding())
        self.scheduler.set_drafts(drafts)
        for req, exc in failed:
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
