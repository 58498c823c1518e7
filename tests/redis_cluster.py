"""A real Redis Cluster for tests: 3 masters, each with a replica, on free loopback ports.

``kill_master_of(key)`` SIGKILLs the master owning a key's slot; its replica takes over
after the node timeout (``wait_healthy`` waits for that). Every node is stopped on exit,
even when setup fails.
"""
from __future__ import annotations

import shutil
import subprocess
import time

import redis

from redis_server import RedisServer

NODE_TIMEOUT_MS = 1000


class RedisCluster:
    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        self.masters, self.replicas = masters, replicas
        args = ("--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0")
        self.nodes = [RedisServer(cluster=True, extra_args=args)
                      for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """Any live node's URL (clients discover the rest)."""
        for node in self.nodes:
            if node.proc is not None:
                return node.url
        raise RuntimeError("no live node")

    def start(self) -> "RedisCluster":
        try:
            for node in self.nodes:
                node.start()
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            subprocess.run([cli, "--cluster", "create",
                            *[f"127.0.0.1:{n.port}" for n in self.nodes],
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=60)
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.url)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every slot is served, every live node agrees the cluster is ok and knows
        every live node (gossip can lag a join on a loaded machine)."""
        deadline = time.monotonic() + timeout
        live = {n.port for n in self.nodes if n.proc is not None}
        while True:
            states = []
            for node in self.nodes:
                if node.proc is None:
                    continue
                try:
                    r = redis.Redis(port=node.port, socket_timeout=1)
                    info = r.cluster("info")
                    owners = {int(s[2][1]) for s in r.execute_command("CLUSTER", "SLOTS")}
                    repl = r.info("replication")
                    synced = repl.get("role") == "master" or repl.get("master_link_status") == "up"
                    states.append(synced and info.get("cluster_state") == "ok"
                                  and int(info.get("cluster_slots_ok", 0)) == 16384
                                  and int(info.get("cluster_known_nodes", 0)) >= len(live)
                                  and owners <= live)
                except redis.RedisError:
                    states.append(False)
            if states and all(states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not become healthy")
            time.sleep(0.1)

    def master_of(self, key: str) -> RedisServer:
        with self.client() as c:
            node = c.get_node_from_key(key)
        return next(n for n in self.nodes if n.port == int(node.port))

    def kill_master_of(self, key: str) -> RedisServer:
        node = self.master_of(key)
        node.kill()
        return node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
