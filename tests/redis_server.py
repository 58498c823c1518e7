"""A real redis-server for tests: own process, free port, no persistence, killable.

Never touches the default port. ``REDIS_SERVER`` overrides the binary.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, and one this process has not handed out before: a cluster
    takes two ports a node for all its nodes before starting any, and the kernel may offer a
    port again while it is still unbound (a node then failed to start on it)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``start()``, ``kill()`` (SIGKILL: state is lost, no persistence), ``restart()``."""

    def __init__(self, port: int | None = None, *, cluster: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.extra_args = extra_args
        self.bus_port = free_port() if cluster else None  # the default (port + 10000) may not exist
        self.binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") \
            or "/usr/bin/redis-server"
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="fleet-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no",
             "--loglevel", "warning",
             *(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(self.bus_port)] if self.cluster else []),
             *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for project subprocesses: the repo importable, small thread counts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def wait_until(predicate, timeout: float = 30, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
