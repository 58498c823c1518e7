"""Fair share between tenants within a lane: who gets the next places a worker has.

Lanes stay strict priority; within a lane the next place goes to the tenant with work
waiting that holds the fewest tokens on this worker per unit of weight (tokens: prompt plus
``max_tokens``, an estimate of the KV blocks a request takes), ties broken by the tokens it
was given over time per weight (a virtual clock that cannot bank credit while idle). So a
tenant's 100,000-line batch fills only the places no one else asks for, and a tenant that
starts submitting is read first as soon as a place frees. Pure: no IO.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from shared.protocol import Request

DEFAULT_COST = 256  # tokens assumed for a tenant's next request before any was seen
_CHARS_PER_TOKEN = 4


def estimate_tokens(request: Request) -> int:
    """Prompt tokens (counted, or estimated from characters) plus ``max_tokens``."""
    if request.prompt_token_ids is not None:
        prompt = len(request.prompt_token_ids)
    elif request.prompt is not None:
        prompt = len(request.prompt) // _CHARS_PER_TOKEN + 1
    else:
        prompt = sum(len(m.content) for m in request.messages or []) // _CHARS_PER_TOKEN + 8
    return prompt + request.max_tokens


@dataclass
class Held:
    """What a tenant holds on this worker now."""

    requests: int = 0
    tokens: int = 0


class FairShare:
    def __init__(self) -> None:
        self._clock: dict[str, float] = {}  # tenant -> tokens given / weight
        self._cost: dict[str, float] = {}  # tenant -> moving average request cost

    def plan(self, waiting: dict[str, int], weights: dict[str, float], held: dict[str, Held],
             caps: dict[str, int | None], room: int) -> dict[str, int]:
        """How many entries to read from each tenant of one lane. ``waiting``: tenant ->
        entries waiting in its stream of that lane."""
        active = [t for t, n in waiting.items() if n > 0]
        if not active or room <= 0:
            return {}
        floor = min(self._clock.get(t, 0.0) for t in active)
        for t in active:  # an idle tenant resumes at the present, with no banked credit
            self._clock[t] = max(self._clock.get(t, 0.0), floor)
        planned: dict[str, int] = {}
        tokens = {t: float(held.get(t, Held()).tokens) for t in active}
        heap = [(tokens[t] / weights[t], self._clock[t], t) for t in active]
        heapq.heapify(heap)
        while heap and room > 0:
            _, clock, t = heapq.heappop(heap)
            count = held.get(t, Held()).requests + planned.get(t, 0)
            if caps.get(t) is not None and count >= caps[t]:
                continue
            planned[t] = planned.get(t, 0) + 1
            room -= 1
            cost = self._cost.get(t, DEFAULT_COST)
            tokens[t] += cost
            if planned[t] < waiting[t]:
                heapq.heappush(heap, (tokens[t] / weights[t], clock + cost / weights[t], t))
        return planned

    def charge(self, tenant: str, tokens: int, weight: float) -> None:
        """A request of ``tenant`` costing ``tokens`` was read."""
        self._clock[tenant] = self._clock.get(tenant, 0.0) + tokens / weight
        avg = self._cost.get(tenant)
        self._cost[tenant] = float(tokens) if avg is None else 0.8 * avg + 0.2 * tokens

    def forget(self, tenant: str) -> None:
        self._clock.pop(tenant, None)
        self._cost.pop(tenant, None)
