"""The whole fleet on a real Redis Cluster: 3 masters with a replica each, started on
loopback ports. Two workers and a gateway are given the URL of one node each; a mixed
workload (two tenants, two lanes, streamed through the producer and through the gateway)
runs while the master holding in-flight requests' keys is killed with SIGKILL. Every
request ends with the tokens an undisturbed run gives (greedy), none lost or repeated at
the client, and the workers keep serving on the promoted replica.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from redis_cluster import RedisCluster
from redis_server import free_port, wait_until

from producer import FleetClient
from producer.cli import main
from producer.client import AsyncFleetClient
from shared import connect, keys, tenants
from shared.tenants import TenantConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import start_gateway  # noqa: E402

TENANTS = ("acme", "globex")
LENGTH = 40


def _prompt(i: int) -> list[int]:
    return [1 + i % 7, 2 + i % 5, 3 + i % 3, 4]


@pytest.fixture
def cluster():
    c = RedisCluster().start()
    yield c
    c.stop()


async def _stream(fleet: AsyncFleetClient, request_id: str, i: int, lane: str) -> list[int]:
    stream = await fleet.submit(request_id=request_id, prompt_token_ids=_prompt(i),
                                max_tokens=LENGTH, temperature=0.0, ignore_eos=True,
                                priority=lane, speculative=False)
    seen = [t for event in [e async for e in stream] for t in event.token_ids]
    result = await stream.result(timeout=180)
    assert seen == result.token_ids, f"{request_id}: streamed tokens differ from the result"
    return result.token_ids


async def _workload(url: str, prefix: str, n: int) -> dict[str, list[int]]:
    clients = {t: AsyncFleetClient(url, tenant=t) for t in TENANTS}
    try:
        jobs = {f"{prefix}-{i}": _stream(clients[TENANTS[i % 2]], f"{prefix}-{i}", i,
                                         "high" if i % 3 == 0 else "default")
                for i in range(n)}
        return dict(zip(jobs, await asyncio.gather(*jobs.values())))
    finally:
        for c in clients.values():
            await c.close()


def _gateway_completion(url: str, key: str, i: int) -> list[int]:
    reply = httpx.post(url + "/v1/completions", timeout=180, headers={
        "Authorization": f"Bearer {key}"}, json={
        "model": "tiny", "prompt": _prompt(i), "max_tokens": LENGTH, "temperature": 0,
        "ignore_eos": True, "logprobs": None})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_killed_master_loses_and_repeats_nothing(cluster, tiny_model, tmp_path):
    admin = connect.sync_client(cluster.url)
    admin.hset(keys.tenants_key(), mapping={
        t: tenants.encode(TenantConfig(name=t, lanes=["high", "default"])) for t in TENANTS})
    from fleet_harness import WorkerFactory
    factory = WorkerFactory(cluster.nodes[0], tiny_model, tmp_path)
    (tmp_path / "keys.json").write_text(json.dumps({"keys": {"sk-a": "acme", "sk-g": "globex"}}))
    gateway = None
    try:
        for n in range(2):
            factory.server = cluster.nodes[n]  # each process is given another node's URL
            factory.start(max_num_seqs=4, claim_idle_ms=4000, tenants_refresh_s=1)
        gateway = start_gateway(cluster.nodes[2].url, tmp_path / "gateway.log", free_port(),
                                "--served-model", "tiny=default",
                                "--api-keys", str(tmp_path / "keys.json"))
        reference = asyncio.run(_workload(cluster.url, "ref", 24))  # undisturbed
        gw_reference = _gateway_completion(gateway.url, "sk-a", 0)

        async def disturbed():
            task = asyncio.create_task(_workload(cluster.nodes[3].url, "run", 24))
            # in flight: started (a token stored), not finished
            key = await asyncio.to_thread(wait_until, lambda: _in_flight(admin), 120, 0.01,
                                          "a request in flight")
            killed = cluster.kill_master_of(key)
            t0 = time.monotonic()
            await asyncio.to_thread(cluster.wait_healthy, 60)
            return killed, time.monotonic() - t0, await task

        killed, failover_s, results = asyncio.run(disturbed())
        for i in range(24):
            assert results[f"run-{i}"] == reference[f"ref-{i}"], f"run-{i} differs"
        assert all(len(o) == LENGTH for o in results.values())
        after = _gateway_completion(gateway.url, "sk-a", 0)  # the gateway serves on
        assert after["choices"][0]["text"] == gw_reference["choices"][0]["text"]
        # the CLI and the blocking client, given yet another node's URL
        node = cluster.nodes[4].url
        assert main(["submit", "Hello", "--raw", "--tenant", "globex", "--max-tokens", "4",
                     "--redis-url", node]) == 0
        assert main(["status", "--json", "--redis-url", node]) == 0
        (tmp_path / "in.jsonl").write_text("".join(json.dumps({
            "prompt_token_ids": _prompt(i), "max_tokens": LENGTH, "temperature": 0,
            "ignore_eos": True, "speculative": False}) + "\n" for i in range(3)))
        assert main(["batch", str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"),
                     "--tenant", "acme", "--lane", "default", "--quiet",
                     "--redis-url", node]) == 0
        lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(lines) == 3 and all("result" in line for line in lines), lines
        with FleetClient(node, tenant="globex") as fleet:
            assert fleet.generate(request_id="sync-0", prompt_token_ids=_prompt(0),
                                  max_tokens=LENGTH, temperature=0.0, ignore_eos=True,
                                  speculative=False, timeout=60).token_ids == reference["ref-0"]
        assert all(w.proc.poll() is None for w in factory.procs), "a worker exited"
        assert killed.proc is None and failover_s < 60
    finally:
        if gateway is not None:
            gateway.stop()
        factory.cleanup()
        admin.close()


def _in_flight(admin) -> str | None:
    for i in range(24):
        tenant = TENANTS[i % 2]
        state = admin.hgetall(keys.state_key(tenant, f"run-{i}"))
        if state.get(b"status") == b"running" and int(state.get(b"published", 0)) >= 3:
            return keys.state_key(tenant, f"run-{i}")
    return None
