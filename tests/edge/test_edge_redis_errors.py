"""Every class of Redis error against a real worker: none ends the process, each has its
behaviour (see gpu_worker/edge/redis_errors.py), and serving resumes when the cause goes."""
from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
import redis
from redis_server import RedisServer, free_port, wait_until

from producer import FleetClient
from shared import keys

PROMPT = [1, 504, 3058, 314, 4649, 30, 9876, 42]
STREAM = keys.stream_key("default", "default", "default")
GREEDY = dict(prompt_token_ids=PROMPT, max_tokens=5, temperature=0.0, ignore_eos=True)


def _ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status, reply.read().decode().strip()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()
    except urllib.error.URLError:  # not listening yet (the model still loading)
        return 0, "not listening"


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _start(workers, **options):
    port = free_port()
    worker = workers.start(metrics_port=port, metrics_host="127.0.0.1", **options)
    wait_until(lambda: _ready(port)[0] == 200, timeout=30, what="the worker ready")
    return worker, port


def test_a_stream_deleted_under_a_blocked_read(workers, redis_server, r):
    """The stream (and its group) deleted while the worker waits for work: the group is
    recreated from id 0, and the next request is served."""
    worker, _ = _start(workers, block_ms=5000)
    time.sleep(0.5)  # the worker is now blocked on the (empty) stream
    r.delete(STREAM)
    time.sleep(0.5)
    with FleetClient(redis_server.url) as fleet:
        assert len(fleet.generate(timeout=30, **GREEDY).token_ids) == 5
    assert worker.proc.poll() is None
    assert "recreating the group" in worker.output()


def test_permission_denied_is_logged_once_not_ready_then_recovers(workers, redis_server, r):
    r.acl_setuser("fw", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all"])
    url = f"redis://fw:pw@127.0.0.1:{redis_server.port}/0"
    worker, port = _start(workers, redis_url=url, block_ms=200)
    r.acl_setuser("fw", enabled=True, commands=["-xreadgroup"])  # enabled: or the user is off
    with FleetClient(redis_server.url) as fleet:
        stream = fleet.submit(**GREEDY)  # seen waiting; reading it is refused
        wait_until(lambda: _ready(port) == (503, "redis: denied"), timeout=20, what="not ready")
        time.sleep(12)  # two slow retries: the request waits in the stream, the log stays quiet
        assert fleet.get_result(stream.request_id) is None
        r.acl_setuser("fw", enabled=True, commands=["+xreadgroup"])
        assert len(stream.result(timeout=30).token_ids) == 5
    wait_until(lambda: _ready(port)[0] == 200, timeout=10, what="ready again")
    assert worker.proc.poll() is None
    log = worker.output()
    assert log.count("Redis denied") == 1 and "ACL user" in log and "pw@" not in log


def test_out_of_memory_stops_reading_keeps_the_work_and_recovers(workers, redis_server, r):
    worker, port = _start(workers, block_ms=200)
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", str(used // 2))
    with FleetClient(redis_server.url) as fleet:
        # The client's own XADD is refused too under OOM: enqueue before, serve after.
        r.config_set("maxmemory", "0")
        stream = fleet.submit(**GREEDY)
        r.config_set("maxmemory", str(used // 2))
        wait_until(lambda: _ready(port) == (503, "redis: oom"), timeout=20, what="not ready")
        assert _metric(port, "fleet:redis_refusing_writes") == 1.0
        time.sleep(3)
        assert fleet.get_result(stream.request_id) is None
        assert r.xpending(STREAM, keys.GROUP)["pending"] <= 1  # handed back, not hoarded
        r.config_set("maxmemory", "0")
        assert len(stream.result(timeout=30).token_ids) == 5
    wait_until(lambda: _ready(port)[0] == 200, timeout=15, what="ready again")
    assert _metric(port, "fleet:redis_refusing_writes") == 0.0
    assert worker.proc.poll() is None
    wait_until(lambda: r.xpending(STREAM, keys.GROUP)["pending"] == 0, timeout=10,
               what="acknowledged")


@pytest.fixture
def two_node_cluster():
    """Two cluster-enabled masters splitting the slots: enough to be answered MOVED."""
    nodes: list[RedisServer] = []
    try:  # a failed setup must not leave servers behind either
        for _ in range(2):
            nodes.append(RedisServer(cluster=True))
            nodes[-1].start()
        a, b = (redis.Redis(port=n.port) for n in nodes)
        a.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
        b.execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
        a.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[1].port, nodes[1].bus_port)
        wait_until(lambda: a.cluster("info")["cluster_state"] == "ok"
                   and b.cluster("info")["cluster_state"] == "ok", timeout=20, what="cluster ok")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def test_a_worker_given_one_node_serves_the_whole_cluster(workers, two_node_cluster):
    """Two masters splitting the slots, no replica: a worker given one node's URL detects
    the cluster, reads and writes on both, and a client given the other node is served."""
    port = free_port()
    worker = workers.start(wait=False, redis_url=two_node_cluster[0].url, metrics_port=port,
                           metrics_host="127.0.0.1")
    wait_until(lambda: _ready(port)[0] == 200, timeout=60, what="ready")
    with FleetClient(two_node_cluster[1].url) as fleet:
        results = [fleet.generate(request_id=f"c{i}", timeout=60, **GREEDY) for i in range(4)]
    assert all(len(r.token_ids) == 5 for r in results)
    assert worker.proc.poll() is None and "Traceback" not in worker.output()
