"""One request a worker holds, and the events it turns engine deltas into."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from gpu_worker.edge.engine_loop import Job
from gpu_worker.edge.scripts import RequestKeys
from gpu_worker.outputs import RequestDelta
from gpu_worker.sampling_params import SamplingParams
from shared import codec, errors, keys
from shared.protocol import Failure, Request, Result, Timings, Token, TokenLogprob, Usage

logger = logging.getLogger(__name__)

LANE_PRIORITY = {lane: rank for rank, lane in enumerate(keys.LANES)}  # lower runs first
MAX_SHARE_RANK = 999  # within a lane: how much its tenant held when it was read (fair share)
RESULT_REASONS = ("stop", "length", "cancelled", "timeout")


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A stream entry as read (or reclaimed) from Redis. ``tenant`` is the tenant whose
    stream it was read from (None: the old shared streams, where the payload names it)."""

    stream: str
    lane: str
    entry_id: str
    fields: dict
    deliveries: int = 1
    tenant: str | None = None

    @property
    def payload(self) -> object:
        """The request JSON as read (``data`` field; None when the entry has none)."""
        return self.fields.get(keys.STREAM_FIELD.encode(), self.fields.get(keys.STREAM_FIELD))


@dataclass(kw_only=True)
class Inflight:
    """A request this worker owns: begun in Redis, queued in or running on the engine."""

    request: Request
    entry: Entry
    owner: str  # the fencing token from BEGIN
    prior_token_ids: list[int]  # delivered by earlier workers (resume)
    prior_text: str
    first_start: float
    first_token_at: float | None
    token_ids: list[int] = field(default_factory=list)  # generated here
    text_parts: list[str] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    handoff: bool = False  # draining: give back instead of finishing
    # Recorded but not yet published (coalescing): the last ``len(held_ids)`` of token_ids.
    held_ids: list[int] = field(default_factory=list)
    held_text: list[str] = field(default_factory=list)
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    last_published: float | None = None  # monotonic; None: no token event published here yet
    share_rank: int = 0  # requests its tenant held here per unit of weight when it was read

    @property
    def tenant(self) -> str:
        """Set from the stream when the request was accepted (the default if built bare)."""
        return self.request.tenant or keys.DEFAULT_TENANT

    @property
    def key(self) -> str:
        return engine_key(self.tenant, self.request.request_id)

    @property
    def redis_keys(self) -> RequestKeys:
        return RequestKeys.of(self.tenant, self.request.request_id)

    def job(self) -> Job:
        r = self.request
        params = SamplingParams(
            max_tokens=r.max_tokens, min_tokens=r.min_tokens, temperature=r.temperature,
            top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, repetition_penalty=r.repetition_penalty,
            presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty,
            seed=r.seed, stop=tuple(r.stop), stop_token_ids=tuple(r.stop_token_ids),
            ignore_eos=r.ignore_eos, logprobs=r.logprobs, speculative=r.speculative)
        messages = None if r.messages is None else [{"role": m.role, "content": m.content}
                                                    for m in r.messages]
        return Job(key=self.key, prompt=r.prompt, messages=messages,
                   prompt_token_ids=r.prompt_token_ids, params=params,
                   priority=LANE_PRIORITY[self.entry.lane] * (MAX_SHARE_RANK + 1)
                   + min(self.share_rank, MAX_SHARE_RANK),
                   resume_token_ids=list(self.prior_token_ids), deadline=r.deadline)

    def record(self, delta: RequestDelta) -> None:
        """Take this step's new tokens; they are held until :meth:`take_event`."""
        self.num_prompt_tokens = delta.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = delta.num_cached_tokens or self.num_cached_tokens
        if not delta.new_token_ids:
            if delta.new_text:  # text released at the end (held back for a stop string)
                self.text_parts.append(delta.new_text)
            return
        seq = delta.num_output_tokens - len(delta.new_token_ids)
        assert seq == len(self.prior_token_ids) + len(self.token_ids), "token sequence broken"
        self.token_ids.extend(delta.new_token_ids)
        self.text_parts.append(delta.new_text)
        self.held_ids.extend(delta.new_token_ids)
        self.held_text.append(delta.new_text)
        if delta.logprobs is not None:
            self.held_logprobs.extend(
                TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top=[tuple(t) for t in lp.top])
                for lp in delta.logprobs)

    def take_event(self) -> Token | None:
        """One event for every token held, ``[seq, seq + n)``, or None if none is; the held
        tokens are then this event's to deliver."""
        if not self.held_ids:
            return None
        seq = len(self.prior_token_ids) + len(self.token_ids) - len(self.held_ids)
        event = Token(request_id=self.request.request_id, seq=seq, token_ids=self.held_ids,
                      text="".join(self.held_text), logprobs=self.held_logprobs or None)
        self.held_ids, self.held_text, self.held_logprobs = [], [], []
        return event

    def due(self, now: float, interval_s: float) -> bool:
        """Whether held tokens go out now: the first event at once, later ones once
        ``interval_s`` passed since the last (``now``: monotonic)."""
        return self.last_published is None or now - self.last_published >= interval_s

    def terminal_event(self, delta: RequestDelta, worker_id: str) -> Result | Failure:
        if delta.finish_reason not in RESULT_REASONS:
            return self.failure(delta.error_code or errors.INTERNAL,
                                delta.error_message or f"finished with {delta.finish_reason}")
        now = time.time()
        submitted = self.request.submitted_at
        timings = Timings(
            queued_s=None if submitted is None else max(self.first_start - submitted, 0.0),
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.first_start,
            total_s=now - (submitted if submitted is not None else self.first_start))
        all_ids = self.prior_token_ids + self.token_ids
        return Result(request_id=self.request.request_id, finish_reason=delta.finish_reason,
                      stop_reason=delta.stop_reason, text=self.prior_text + "".join(self.text_parts),
                      token_ids=all_ids,
                      usage=Usage(prompt_tokens=self.num_prompt_tokens,
                                  completion_tokens=len(all_ids),
                                  cached_tokens=self.num_cached_tokens),
                      timings=timings, worker_id=worker_id,
                      num_resumes=1 if self.prior_token_ids else 0)

    def failure(self, code: str, message: str) -> Failure:
        return Failure(request_id=self.request.request_id, code=code, message=message)


def engine_key(tenant: str, request_id: str) -> str:
    return f"{tenant}/{request_id}"


def resume_state(events: list[bytes]) -> tuple[list[int], str]:
    """The tokens and text already delivered, from the stored progress list.

    Events tile ``[0, n)`` by ``seq``; a copy appended twice (a retried write) is skipped.
    """
    token_ids: list[int] = []
    text: list[str] = []
    for raw in events:
        event = codec.decode_token(raw)
        end = event.seq + len(event.token_ids)
        if end <= len(token_ids):
            continue
        if event.seq != len(token_ids):
            logger.error("progress of %s has a gap at %d; resuming from there",
                         event.request_id, len(token_ids))
            break
        token_ids.extend(event.token_ids)
        text.append(event.text)
    return token_ids, "".join(text)
