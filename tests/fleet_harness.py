"""Fixtures shared by the edge and producer tests: a real redis-server per test on a
free port, and real worker processes (the ``fleet worker`` CLI as a subprocess)."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from redis_server import REPO, RedisServer, subprocess_env

from shared import codec, connect, keys


class ChannelListener:
    """Every event published on the channels given (or matching ``pattern``), as received
    (no dedup), recorded by ``on_event`` in a thread of its own."""

    def __init__(self, url: str, *, channels: tuple[str, ...] = (), pattern: str | None = None) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        if channels:
            self.pubsub.subscribe(*channels)
        if pattern:
            self.pubsub.psubscribe(pattern)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                message = self.pubsub.get_message(timeout=0.2)
            except (redis.ConnectionError, ValueError):
                return
            if message is not None:
                self.on_event(message["channel"].decode(), codec.decode_event(message["data"]))

    def on_event(self, channel: str, event) -> None:
        raise NotImplementedError


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen, worker_id: str, log: Path) -> None:
        self.proc, self.worker_id, self.log = proc, worker_id, log

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class WorkerFactory:
    """Starts ``fleet worker`` processes (the real CLI) and cleans them up."""

    def __init__(self, server: RedisServer, model: str, tmp: Path) -> None:
        self.server, self.model, self.tmp = server, model, tmp
        self.procs: list[WorkerProcess] = []

    def start(self, *, wait: bool = True, model: str | None = "tiny", env: dict | None = None,
              **options) -> WorkerProcess:
        worker_id = options.pop("worker_id", f"w{len(self.procs)}")
        args = {"kv_cache_memory": "8MiB", "claim_idle_ms": 1500, "heartbeat_s": 0.3,
                "drain_grace_s": 5, "block_ms": 200, **options}
        cmd = [sys.executable, "-m", "gpu_worker.cli", "worker", "--redis-url", self.server.url,
               "--worker-id", worker_id]
        if model is not None:
            cmd += ["--model", self.model if model == "tiny" else model]
        for name, value in args.items():
            cmd += [f"--{name.replace('_', '-')}", str(value)]
        log = self.tmp / f"{worker_id}.log"
        proc = subprocess.Popen(cmd, cwd=REPO, env={**subprocess_env(), **(env or {})},
                                stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
        worker = WorkerProcess(proc, worker_id, log)
        self.procs.append(worker)
        if wait:
            self.wait_ready(worker)
        return worker

    def wait_ready(self, worker: WorkerProcess, timeout: float = 120) -> None:
        client = connect.sync_client(self.server.url)  # a single server or a cluster
        deadline = time.monotonic() + timeout
        while not client.exists(keys.worker_key("default", worker.worker_id)):
            if worker.proc.poll() is not None:
                raise RuntimeError(f"worker exited {worker.proc.returncode}:\n{worker.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready:\n{worker.output()}")
            time.sleep(0.05)
        client.close()

    def cleanup(self) -> None:
        for w in self.procs:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                w.proc.wait(10)


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from gpu_worker.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def workers(redis_server, tiny_model, tmp_path):
    factory = WorkerFactory(redis_server, tiny_model, tmp_path)
    yield factory
    factory.cleanup()
