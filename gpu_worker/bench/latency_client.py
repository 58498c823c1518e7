"""The client side of ``python -m gpu_worker.bench.latency``, run as its own process:
submits the workload through Redis on a fixed arrival schedule and records when each
request's tokens arrive.

``python -m gpu_worker.bench.latency_client SPEC.json OUT.json``; SPEC: ``redis_url``,
``model_name``, ``interval_ms`` and ``items`` (``{"prompt_token_ids": [...], "max_tokens": n}``).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time


def per_request(start: float, events: list[tuple[float, int]]) -> tuple[float, list[float]]:
    """(TTFT, inter-token latencies) of one request: ``events`` are (arrival time, tokens);
    an event carrying k tokens after a gap g counts as k tokens g/k apart."""
    ttft = events[0][0] - start
    itl: list[float] = []
    previous = events[0][0]
    itl += [0.0] * (events[0][1] - 1)  # tokens that arrived with the first one
    for at, count in events[1:]:
        itl += [(at - previous) / count] * count
        previous = at
    return ttft, itl


async def _one(fleet, item: dict, due: float) -> dict:
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    start = time.perf_counter()
    stream = await fleet.submit(prompt_token_ids=item["prompt_token_ids"], max_tokens=item["max_tokens"],
                                temperature=0.0, ignore_eos=True)
    events = []
    async for token in stream:
        events.append((time.perf_counter(), len(token.token_ids)))
    await stream.result()
    return {"start": start, "events": events}


async def run(spec: dict) -> dict:
    from producer.client import AsyncFleetClient

    items, interval_s = spec["items"], spec["interval_ms"] / 1000.0
    async with AsyncFleetClient(spec["redis_url"], model=spec["model_name"]) as fleet:
        await _one(fleet, {**items[0], "max_tokens": 2}, 0.0)  # warm-up: connections, caches
        t0 = time.perf_counter()
        timed = await asyncio.gather(*(_one(fleet, item, t0 + i * interval_s) for i, item in enumerate(items)))
    return {"requests": timed, "wall_s": time.perf_counter() - t0}


if __name__ == "__main__":
    spec_path, out_path = sys.argv[1:3]
    with open(spec_path) as f:
        report = asyncio.run(run(json.load(f)))
    with open(out_path, "w") as f:
        json.dump(report, f)
