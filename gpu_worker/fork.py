"""Parallel sampling: ``n`` samples of one prompt over one :class:`EngineCore`.

The first sample to run (the *leader*) is queued at once; the others wait until the
leader's prefill has produced its first token. By then its full prompt blocks are computed
and hashed, so each sample queued then takes them from the prefix cache by reference
(ref counts in the block pool: no copy) and computes only the prompt's partial last block
and its own tokens, as vLLM's parallel sampling does. Each sample is an ordinary request of
the scheduler (engine id ``<id>`` for sample 0, ``<id>#<i>`` for sample ``i``: ``#`` is not
in the request-id alphabet), so preemption, recompute, deadlines and stops apply to each
alone; the request ends when every sample has ended.

Seeds: sample 0 uses the request's seed (so ``n == 1`` changes nothing); sample ``i`` uses
:func:`sample_seed`; unseeded samples draw from the engine's generator, independently.
Deltas come back with the request's id and the sample's ``index``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpu_worker.outputs import RequestDelta
from gpu_worker.request import Request
from gpu_worker.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
_ENDS_BEFORE_FORK = ("error", "cancelled", "timeout", "fenced")  # no sample can run then


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` (0 keeps the request's own; None stays unseeded)."""
    if seed is None or index == 0:
        return seed
    return (seed * _SEED_MIX + index * 0xD1B54A32D192ED03 + 1) % (2**63 - 1)


def engine_id(request_id: str, index: int) -> str:
    return request_id if index == 0 else f"{request_id}#{index}"


@dataclass
class _Group:
    request_id: str
    waiting: list[Request]                        # samples to queue once the leader prefilled
    running: set[int] = field(default_factory=set)


class ParallelSampling:
    """Fans requests with ``n > 1`` out into samples and their deltas back in."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._groups: dict[str, _Group] = {}
        self._by_engine_id: dict[str, tuple[str, int]] = {}
        self._pending_ends: list[RequestDelta] = []   # samples ended by an abort, for the next step

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], params: SamplingParams, *,
                    n: int = 1, resume: Sequence[Sequence[int]] = (), skip: Sequence[int] = (),
                    priority: int = 0, deadline: float | None = None) -> None:
        """Queue ``n`` samples; ``resume[i]``: sample i's tokens already delivered; samples in
        ``skip`` have ended already and are not run. Every sample is validated before
        anything is queued (raises :class:`InvalidRequestError`)."""
        if n == 1 and not skip:
            self.engine.add_request(request_id, prompt_token_ids, params, priority=priority,
                                    resume_token_ids=resume[0] if resume else (), deadline=deadline)
            return
        indices = [i for i in range(n) if i not in set(skip)]
        samples = [self.engine.factory.make(
            engine_id(request_id, i), prompt_token_ids,
            dataclasses.replace(params, seed=sample_seed(params.seed, i)), priority=priority,
            resume_token_ids=resume[i] if i < len(resume) else (), deadline=deadline) for i in indices]
        if not samples:
            return
        self.engine.scheduler.add_request(samples[0])
        group = self._groups[request_id] = _Group(request_id, samples[1:], {indices[0]})
        for i in indices:
            self._by_engine_id[engine_id(request_id, i)] = (request_id, i)
        if samples[0].output_token_ids and len(samples) > 1:
            self._fork(group)  # a resumed leader: its prompt blocks are no more shared than others'

    def abort_request(self, request_id: str, reason: str = "cancelled") -> bool:
        """End every sample of a request (those not queued yet end at the next step)."""
        group = self._groups.get(request_id)
        if group is None:
            return self.engine.abort_request(request_id, reason)
        aborted = [self.engine.abort_request(engine_id(request_id, i), reason) for i in list(group.running)]
        self._end_waiting(group, reason)
        return any(aborted) or bool(group.running)

    def step(self) -> list[RequestDelta]:
        """One engine step; each sample's delta carries its request's id and its index."""
        out, self._pending_ends = self._pending_ends, []
        for d in self.engine.step() if self.engine.has_unfinished_requests() else []:
            owner = self._by_engine_id.get(d.request_id)
            out += [d] if owner is None else self._sample_deltas(d, *owner)
        return out

    def _sample_deltas(self, d: RequestDelta, request_id: str, index: int) -> list[RequestDelta]:
        group = self._groups[request_id]
        out = [dataclasses.replace(d, request_id=request_id, index=index)]
        if group.waiting and (d.new_token_ids or d.finished):
            if d.finished and not d.new_token_ids and d.finish_reason in _ENDS_BEFORE_FORK:
                out += self._end_waiting(group, d.finish_reason, d)
            else:
                self._fork(group)
        if d.finished:
            group.running.discard(index)
            del self._by_engine_id[d.request_id]
            if not group.running and not group.waiting:
                del self._groups[request_id]
        return out

    def _fork(self, group: _Group) -> None:
        for req in group.waiting:
            self.engine.scheduler.add_request(req)
            group.running.add(self._by_engine_id[req.request_id][1])
        group.waiting = []

    def _end_waiting(self, group: _Group, reason: str, like: RequestDelta | None = None) -> list[RequestDelta]:
        """End the samples never queued as the leader ended (the same reason, no tokens);
        their deltas are returned (and kept for the next step when ``like`` is None)."""
        deltas = []
        for req in group.waiting:
            _, index = self._by_engine_id.pop(req.request_id)
            deltas.append(RequestDelta(
                request_id=group.request_id, index=index, new_token_ids=[], new_text="", finished=True,
                finish_reason=reason, num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
                error_code=like.error_code if like else None, error_message=like.error_message if like else None))
        group.waiting = []
        if like is None:
            self._pending_ends += deltas
        return deltas

    # -- what the edge asks ---------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests() or bool(self._pending_ends)

    def unfinished_request_ids(self) -> list[str]:
        """Request ids (not sample ids) whose final deltas have not all been returned."""
        ids = [self._by_engine_id.get(i, (i, 0))[0] for i in self.engine.unfinished_request_ids()]
        ids += [g.request_id for g in self._groups.values() if g.waiting]
        return list(dict.fromkeys(ids))

    def can_admit(self, num_prompt_tokens: int, max_tokens: int, n: int = 1) -> bool:
        """Whether ``n`` samples fit beside what is held: the prompt's full blocks once, its
        partial block and the outputs per sample; the samples still to fork count too."""
        if n == 1 and not self._groups:
            return self.engine.can_admit(num_prompt_tokens, max_tokens)
        bs = self.engine.kv.block_size
        per_sample = num_prompt_tokens % bs + min(max_tokens, max(self.engine.max_model_len - num_prompt_tokens, 0))
        total = num_prompt_tokens + (n - 1) * (per_sample + bs) + per_sample
        pending = sum(r.num_prompt_tokens % bs + r.max_output_tokens + bs
                      for g in self._groups.values() for r in g.waiting)
        return self.engine.scheduler.can_admit(total + pending)
