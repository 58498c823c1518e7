"""``fleet bench peers --rounds N``: this engine and vLLM loaded side by side, each in a
process of its own, taking turns at the same job N times (ABBA order: A B, B A, A B, ...),
so that each round's pair of figures is measured minutes apart rather than a whole run
apart. On the 2-core machines measured here the speed of the machine moves by a third
within minutes; a ratio per round, and the median of them, is what survives that.

Only one engine runs at a time: the others wait, loaded and stopped (SIGSTOP to the
runner's whole process group: left running beside it, this engine's median fell to 104
tokens/s and one round to 0.42x vLLM's, with the load average at 2.8), for their turn
(peers_job.main's control folder: ``ready``, then ``go.<r>`` -> ``out.<r>.json``). A runner
that fails is reported as failed and the rounds go on without it.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Runner:
    """One engine's runner: ``command JOB.json OUT.json *extra`` (peers_job.main)."""
    command: list[str]
    extra: list[str]
    job: dict
    env: dict[str, str]
    log_path: Path


class _Live:
    def __init__(self, name: str, runner: Runner, folder: Path, rounds: int) -> None:
        folder.mkdir(parents=True)
        job_path = folder / "job.json"
        job_path.write_text(json.dumps({**runner.job, "control": str(folder), "rounds": rounds}))
        self.name, self.folder = name, folder
        self.log = open(runner.log_path, "w")
        self.proc = subprocess.Popen([*runner.command, str(job_path), str(folder / "unused.json"), *runner.extra],
                                     env={**os.environ, **runner.env}, cwd=REPO, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.failed: str | None = None
        self.results: list[dict] = []

    def wait_for(self, name: str, timeout_s: float) -> dict | None:
        """The JSON the runner writes as ``name``; None (and ``failed`` set) if it exits or
        takes longer than ``timeout_s``."""
        path, deadline = self.folder / name, time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None:
                self.failed = f"failed: the runner exited with {self.proc.returncode}; see {self.log.name}"
                return None
            if time.monotonic() > deadline:
                self.failed = f"failed: no {name} after {timeout_s:.0f} s; see {self.log.name}"
                return None
            time.sleep(0.1)
        return json.loads(path.read_text())

    def pause(self, stop: bool) -> None:
        """SIGSTOP (or SIGCONT) to the runner and every process it started."""
        try:
            os.killpg(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to the runner's process group (vLLM's engine process included)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.pause(False)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self.log.close()


def run_rounds(runners: dict[str, Runner], rounds: int, timeout_s: float) -> dict[str, list[dict] | dict]:
    """name -> its rounds' results in order, or {"skipped": why} for a runner that failed."""
    with tempfile.TemporaryDirectory(prefix="fleet-peers-rounds-") as tmp:
        live = [_Live(name, r, Path(tmp) / f"runner{i}", rounds) for i, (name, r) in enumerate(runners.items())]
        try:
            for one in live:   # every engine loaded before any round starts, then stopped
                if one.wait_for("ready", timeout_s) is not None:
                    one.pause(True)
            for k in range(rounds):
                for one in live if k % 2 == 0 else live[::-1]:
                    if one.failed:
                        continue
                    one.pause(False)
                    (one.folder / f"go.{k}").touch()
                    result = one.wait_for(f"out.{k}.json", timeout_s)
                    one.pause(True)
                    if result is not None:
                        one.results.append(result)
                        logger.info("round %d: %s done", k + 1, one.name)
        except BaseException:   # interrupted: leave no runner (or its children) behind
            for one in live:
                one.kill()
            raise
        finally:
            for one in live:
                if one.failed:
                    one.kill()
                one.close()
    return {one.name: {"skipped": one.failed} if one.failed else one.results for one in live}
