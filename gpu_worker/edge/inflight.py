"""One request a worker holds, and the events it turns engine deltas into."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from gpu_worker.edge.choices import ChoiceState, resume_choices
from gpu_worker.edge.engine_loop import Job
from gpu_worker.edge.scripts import RequestKeys
from gpu_worker.outputs import RequestDelta
from gpu_worker.sampling_params import SamplingParams
from gpu_worker.structured import from_wire
from shared import errors, keys
from shared.protocol import Choice, Failure, Request, Result, Timings, Token, Usage

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
    """A request this worker owns: begun in Redis, queued in or running on the engine.

    ``prior_token_ids``/``prior_text``: what earlier workers delivered of choice 0;
    ``prior_choices`` the same for choices 1..n-1 and ``ended`` the choices an earlier
    worker already ended (their stored :class:`Choice`)."""

    request: Request
    entry: Entry
    owner: str  # the fencing token from BEGIN
    prior_token_ids: list[int]  # delivered by earlier workers (resume)
    prior_text: str
    first_start: float
    first_token_at: float | None
    prior_choices: list[tuple[list[int], str]] = field(default_factory=list)
    ended: dict[int, Choice] = field(default_factory=dict)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    handoff: bool = False  # draining: give back instead of finishing
    last_published: float | None = None  # monotonic; None: no token event published here yet
    share_rank: int = 0  # requests its tenant held here per unit of weight when it was read
    choices: list[ChoiceState] = field(init=False)

    def __post_init__(self) -> None:
        priors = [(self.prior_token_ids, self.prior_text), *self.prior_choices]
        priors += [([], "")] * (self.request.n - len(priors))
        self.choices = [ChoiceState(index=i, prior_token_ids=list(ids), prior_text=text,
                                    ended=self.ended.get(i)) for i, (ids, text) in enumerate(priors)]

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

    @property
    def holds_tokens(self) -> bool:
        return any(c.held_ids for c in self.choices)

    @property
    def all_ended(self) -> bool:
        return all(c.ended is not None for c in self.choices)

    def job(self) -> Job:
        r = self.request
        params = SamplingParams(
            max_tokens=r.max_tokens, min_tokens=r.min_tokens, temperature=r.temperature,
            top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, repetition_penalty=r.repetition_penalty,
            presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty,
            seed=r.seed, stop=tuple(r.stop), stop_token_ids=tuple(r.stop_token_ids),
            ignore_eos=r.ignore_eos, logprobs=r.logprobs, speculative=r.speculative,
            structured=from_wire(r.structured))
        messages = None if r.messages is None else [{"role": m.role, "content": m.content}
                                                    for m in r.messages]
        return Job(key=self.key, prompt=r.prompt, messages=messages,
                   prompt_token_ids=r.prompt_token_ids, params=params,
                   priority=LANE_PRIORITY[self.entry.lane] * (MAX_SHARE_RANK + 1)
                   + min(self.share_rank, MAX_SHARE_RANK),
                   resume_token_ids=list(self.prior_token_ids), deadline=r.deadline, n=r.n,
                   resume_choices=[list(c.prior_token_ids) for c in self.choices],
                   skip=[c.index for c in self.choices if c.ended is not None])

    def record(self, delta: RequestDelta) -> Choice | None:
        """Take this step's new tokens (held until :meth:`take_events`); the choice's end
        when the delta ends it."""
        self.num_prompt_tokens = delta.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = delta.num_cached_tokens or self.num_cached_tokens
        choice = self.choices[delta.index]
        choice.record(delta)
        if delta.finished and delta.finish_reason in RESULT_REASONS and choice.ended is None:
            return choice.end(delta.finish_reason, delta.stop_reason)
        return None

    def take_events(self) -> list[Token]:
        """One event per choice for every token it holds (none if it holds none); the held
        tokens are then these events' to deliver."""
        events = [c.take_event(self.request.request_id) for c in self.choices]
        return [e for e in events if e is not None]

    def due(self, now: float, interval_s: float) -> bool:
        """Whether held tokens go out now: the first event at once, later ones once
        ``interval_s`` passed since the last (``now``: monotonic)."""
        return self.last_published is None or now - self.last_published >= interval_s

    def terminal_event(self, delta: RequestDelta, worker_id: str) -> Result | Failure:
        """The terminal event once ``delta`` ended the request (with ``n > 1``: its last
        choice; the other choices' ends are recorded)."""
        if delta.finish_reason not in RESULT_REASONS:
            return self.failure(delta.error_code or errors.INTERNAL,
                                delta.error_message or f"finished with {delta.finish_reason}")
        for c in self.choices:
            if c.ended is None:
                c.end(delta.finish_reason, delta.stop_reason)
        now = time.time()
        submitted = self.request.submitted_at
        timings = Timings(
            queued_s=None if submitted is None else max(self.first_start - submitted, 0.0),
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.first_start,
            total_s=now - (submitted if submitted is not None else self.first_start))
        first = self.choices[0].ended
        return Result(request_id=self.request.request_id, finish_reason=first.finish_reason,
                      stop_reason=first.stop_reason, text=first.text, token_ids=first.token_ids,
                      usage=Usage(prompt_tokens=self.num_prompt_tokens,
                                  completion_tokens=sum(len(c.ended.token_ids) for c in self.choices),
                                  cached_tokens=self.num_cached_tokens),
                      timings=timings, worker_id=worker_id,
                      num_resumes=1 if any(c.prior_token_ids for c in self.choices) else 0,
                      choices=[c.ended for c in self.choices] if self.request.n > 1 else None)

    def failure(self, code: str, message: str) -> Failure:
        return Failure(request_id=self.request.request_id, code=code, message=message)


def engine_key(tenant: str, request_id: str) -> str:
    return f"{tenant}/{request_id}"


def resume_state(events: list[bytes]) -> tuple[list[int], str]:
    """Choice 0's tokens and text already delivered, from the stored progress list (see
    :func:`~gpu_worker.edge.choices.resume_choices`)."""
    return resume_choices(events, 1)[0]
