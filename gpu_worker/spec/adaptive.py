"""Adaptive speculation depth: k per request from its recent acceptance, and none at all
when the batch is already compute-bound.

Step time is modelled online as ``a + b * tokens`` (least squares over recent decode steps),
once for steps that verify drafts and once for plain ones: a step with drafts can take
another path (on the CPU, a step whose drafts share it with a prefill chunk runs op by op;
one of decode and verification rows alone stays on the fused decode layers), so its time is
not the plain line extended. The
j-th draft of a request with acceptance rate ``alpha`` yields ``alpha**j`` extra tokens in
expectation and costs ``b`` (one more token in the target's batch) plus the drafter's cost
per token. It is worth proposing only while that yield per second beats the rate the step
already achieves (tokens per second of a plain step). In a small, memory-bound batch ``a``
dominates and deep drafts pay; in a large, compute-bound batch the marginal token costs as
much as a plain step's tokens, so no draft is proposed. Once a step's drafts are known, the
speculator drops them all where the step with them (its own line, at its size, plus their
expected accepted tokens) yields fewer tokens a second than the plain step
(:meth:`AdaptiveDepth.worth_it`): drafts for a few requests of a large batch move every row
off the plain path. It keeps the plain line current by leaving one step in PLAIN_EVERY
without drafts, one in PLAIN_EVERY_MEASURED once the line is measured
(:meth:`AdaptiveDepth.plain_step_due`), and the drafted line by letting one step in
PLAIN_EVERY_MEASURED draft whatever the check says (:meth:`AdaptiveDepth.drafted_step_due`).
"""
from __future__ import annotations

from collections import deque

PRIOR_ACCEPTANCE = 0.6
EMA = 0.3
PROBE_EVERY = 32          # a request with k = 0 first retries one draft after this many steps
PLAIN_EVERY = 16          # one decode step in this many goes without drafts (the plain line's data),
PLAIN_EVERY_MEASURED = 64  # and one in this many once that line is measured


class StepCostModel:
    def __init__(self, window: int = 64) -> None:
        self._obs: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens > 0 and seconds > 0:
            self._obs.append((num_tokens, seconds))

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) of ``time = a + b * tokens``; None until the data spans several sizes."""
        if len(self._obs) < 8:
            return None
        xs, ys = zip(*self._obs)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        if var < 1e-9 or max(xs) < 2 * min(xs):
            return None
        b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 1e-7)
        a = max(my - b * mx, 0.0)
        return a, b


class AdaptiveDepth:
    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.cost = StepCostModel()             # steps that verified no drafts
        self.spec_cost = StepCostModel()        # steps that did: maybe another path (see the module's doc)
        self.draft_seconds_per_token = 0.0      # measured cost of drafting one token
        self._alpha: dict[str, float] = {}
        self._idle: dict[str, int] = {}
        # Acceptance over all requests: a new request starts from what this proposer has
        # achieved lately, so a drafter that rarely hits is not tried afresh on each request.
        self.global_alpha = PRIOR_ACCEPTANCE

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        if drafted > 0:
            # Verification stops at the first rejection, so only accepted + (one rejected)
            # positions were tested: that is the sample for the per-token acceptance rate.
            tested = accepted + (1 if accepted < drafted else 0)
            rate = accepted / tested
            prev = self._alpha.get(request_id, self.global_alpha)
            self._alpha[request_id] = (1 - EMA) * prev + EMA * rate
            self.global_alpha = (1 - EMA / 4) * self.global_alpha + EMA / 4 * rate

    def forget(self, request_id: str) -> None:
        self._alpha.pop(request_id, None)
        self._idle.pop(request_id, None)

    def observe(self, num_tokens: int, seconds: float, drafted: bool) -> None:
        """A decode step's size and time, filed by whether it verified drafts."""
        (self.spec_cost if drafted else self.cost).observe(num_tokens, seconds)

    def plain_step_due(self, proposals: int) -> bool:
        """Whether the ``proposals``-th drafting step should go plain instead, for the plain line."""
        every = PLAIN_EVERY if self.cost.coefficients() is None else PLAIN_EVERY_MEASURED
        return proposals % every == 0

    def drafted_step_due(self, proposals: int) -> bool:
        """Whether the ``proposals``-th step drafts whatever :meth:`worth_it` says, so that the
        drafted line stays measured too (it would freeze once drafting stopped, and a load that
        fell back to a few requests would be judged by the crowd's old figures)."""
        return proposals % PLAIN_EVERY_MEASURED == PLAIN_EVERY_MEASURED // 2

    def worth_it(self, batch_tokens: int, drafts: dict[str, int], unpaid: bool = False) -> bool:
        """Whether a step that verifies ``drafts`` (request id -> drafted tokens) beside its
        ``batch_tokens`` plain rows yields more tokens a second than the same step without
        them, each line at its own size (``unpaid``: the drafts are still to be made, so their
        drafting time counts too); True until both kinds of step have been measured. A whole
        step changes path for one request's drafts, so the gain of those few requests is
        weighed against the cost to every row."""
        plain, spec = self.cost.coefficients(), self.spec_cost.coefficients()
        if plain is None or spec is None:
            return True
        n = batch_tokens
        gained = sum(sum(self._alpha.get(rid, self.global_alpha) ** j for j in range(1, k + 1))
                     for rid, k in drafts.items())
        spec_seconds = spec[0] + spec[1] * (n + sum(drafts.values()))
        if unpaid:
            spec_seconds += self.draft_seconds_per_token * sum(drafts.values())
        return (n + gained) / spec_seconds > n / (plain[0] + plain[1] * n)

    def depth(self, request_id: str, batch_tokens: int) -> int:
        """Drafts to propose for this request, given the plain batch size."""
        alpha = self._alpha.get(request_id, self.global_alpha)
        coef = self.spec_cost.coefficients() or self.cost.coefficients()
        if coef is None:
            k = self.max_k if alpha > 0.3 else 1      # no cost data yet: go by acceptance only
        else:
            a, b = coef
            step_rate = batch_tokens / (a + b * batch_tokens)    # tokens/s of a plain step
            marginal_cost = b + self.draft_seconds_per_token
            k = 0
            while k < self.max_k and alpha ** (k + 1) / marginal_cost > step_rate:
                k += 1
        if k == 0:
            # Probe with one draft after PROBE_EVERY idle steps, then after twice as many, ...:
            # a drafter that keeps missing costs less and less.
            idle = self._idle.get(request_id, 0) + 1
            self._idle[request_id] = idle
            if idle >= PROBE_EVERY and idle & (idle - 1) == 0 and idle % PROBE_EVERY == 0:
                return 1
        return k
