"""llama.cpp's ``llama-server`` for ``fleet bench peers``: started on 127.0.0.1 with
continuous batching over 16 slots, driven with concurrent ``/completion`` requests of
token-id prompts (greedy, exactly n_predict tokens, no prompt cache), then stopped.

A server killed by a signal while it loads is started once more with ``--no-repack``:
llama.cpp 0.3.36 (the pinned build) dies with a segmentation fault in its weight repacking
when it loads a Q4_1 or Q8_0 GGUF on an Intel Xeon with AMX (seen on two sessions' machines). The
retry, and why, goes into the run's settings; the crashed attempt's log is kept beside it."""
from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from gpu_worker.bench.peers_job import run_job

logger = logging.getLogger(__name__)

SLOTS = 16
NO_REPACK = "--no-repack"
CONTEXT_PER_SLOT = 1024     # the workload's longest request is 384 + 160 tokens


def server_command(binary: Path, gguf: Path, port: int, threads: int, kv_type: str,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """``llama-server`` on loopback only: ``SLOTS`` parallel sequences, continuous batching,
    then ``extra`` (``--no-repack``, say)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(SLOTS), "-cb", "-c", str(SLOTS * CONTEXT_PER_SLOT),
            "-ctk", kv_type, "-ctv", kv_type, "--no-webui", "--log-disable", *extra]


def completion_body(prompt: list[int], n: int) -> dict:
    """One greedy request of exactly ``n`` tokens (ignore_eos) with its token ids returned."""
    return {"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True, "stream": False}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


class ServerExited(RuntimeError):
    """llama-server ended before it was ready; ``returncode`` < 0: killed by that signal."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"llama-server exited with {returncode}" if returncode >= 0 else
                         f"llama-server was killed by {signal.Signals(-returncode).name} while loading")
        self.returncode = returncode


def _wait_ready(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerExited(proc.returncode)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not become ready")


@contextmanager
def server(binary: Path, gguf: Path, threads: int, kv_type: str, log_path: Path, extra: tuple[str, ...] = ()):
    """A running llama-server; yields its port and stops it on exit."""
    port = _free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server_command(binary, gguf, port, threads, kv_type, extra), stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        _wait_ready(port, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_generate(port: int):
    """A peers_job ``generate``: every prompt sent at once, the server's slots batch them."""
    def generate(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            replies = list(pool.map(lambda pn: _post(port, completion_body(*pn)), zip(prompts, lengths)))
        return [r["tokens"] for r in replies]
    return generate


def run_llama(binary: Path, gguf: Path, job: dict, threads: int, log_path: Path, extra: tuple[str, ...] = ()) -> dict:
    """The peers job against one GGUF; f32 KV cache for an F32 GGUF, f16 for the others. A
    server killed by a signal at load is retried once with ``--no-repack`` (the module's doc)."""
    try:
        return _run_llama_once(binary, gguf, job, threads, log_path, extra)
    except ServerExited as exc:
        if exc.returncode >= 0 or NO_REPACK in extra:
            raise
        crashed = log_path.with_suffix(".crashed.log")
        log_path.replace(crashed)
        logger.warning("%s (%s; log %s): starting it again with %s", exc, gguf.name, crashed, NO_REPACK)
        result = _run_llama_once(binary, gguf, job, threads, log_path, (*extra, NO_REPACK))
        result["settings"]["retried"] = f"{exc}; ran with {NO_REPACK}"
        return result


def _run_llama_once(binary: Path, gguf: Path, job: dict, threads: int, log_path: Path,
                    extra: tuple[str, ...]) -> dict:
    kv_type = "f32" if "F32" in gguf.name else "f16"
    t0 = time.perf_counter()
    with server(binary, gguf, threads, kv_type, log_path, extra) as port:
        load_s = time.perf_counter() - t0
        result = run_job(job, http_generate(port))
    settings = {"gguf": gguf.name, "threads": threads, "slots": SLOTS, "kv_type": kv_type,
                "context": SLOTS * CONTEXT_PER_SLOT, "extra_args": list(extra)}
    return {"load_s": load_s, "threads": threads, "settings": settings, **result}
