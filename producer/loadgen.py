"""The client side of ``fleet bench e2e``, run as its own process.

``python -m producer.loadgen --redis-url URL --model-name M --workload W.jsonl --out R.json``
W: one ``{"prompt_token_ids": [...], "max_tokens": n}`` per line. Phase 1 (low load): the
first ``--low-load`` items one at a time with ``max_tokens`` 2, TTFT each. Phase 2
(throughput): every item submitted at once, greedy, ``ignore_eos``; TTFT per request from
its submit, output tokens/s over the whole run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from producer.client import AsyncFleetClient


async def _timed(fleet: AsyncFleetClient, item: dict, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    stream = await fleet.submit(prompt_token_ids=item["prompt_token_ids"], max_tokens=max_tokens,
                                temperature=0.0, ignore_eos=True)
    ttft = None
    async for _ in stream:
        if ttft is None:
            ttft = time.perf_counter() - t0
    result = await stream.result()
    return ttft if ttft is not None else float("nan"), len(result.token_ids)


async def run(args: argparse.Namespace) -> dict:
    with open(args.workload) as f:
        items = [json.loads(line) for line in f if line.strip()]
    async with AsyncFleetClient(args.redis_url, model=args.model_name) as fleet:
        await _timed(fleet, items[0], 2)  # warm-up: connections, worker caches
        low = [(await _timed(fleet, item, 2))[0] for item in items[:args.low_load]]
        t0 = time.perf_counter()
        loaded = await asyncio.gather(*(_timed(fleet, item, item["max_tokens"]) for item in items))
        wall = time.perf_counter() - t0
    return {"ttft_low_load_s": low, "ttft_loaded_s": [x[0] for x in loaded],
            "output_tokens": sum(x[1] for x in loaded), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--low-load", type=int, default=8)
    args = parser.parse_args()
    report = asyncio.run(run(args))
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
