"""One fleet for the whole gateway suite: a real redis-server, one real worker on the
embedded SmolLM2-135M-Instruct, and ``fleet gateway`` itself as a subprocess.

The gateway serves ``smol`` (the worker's namespace) and ``idle`` (a namespace no worker
serves, so its queue only fills). Tenants: ``acme`` (no quota), ``limited`` (2 requests a
minute), ``single`` (1 request in flight).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import WorkerFactory  # noqa: E402
from redis_server import REPO, RedisServer, free_port, subprocess_env  # noqa: E402

KEYS = {"sk-acme": "acme", "sk-limited": "limited", "sk-single": "single"}
QUEUE_BOUND = 3


@pytest.fixture(scope="session")
def fleet_redis():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from gpu_worker.model.default_model import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def fleet_worker(fleet_redis, tmp_path_factory, model_dir):
    factory = WorkerFactory(fleet_redis, None, tmp_path_factory.mktemp("workers"))
    worker = factory.start(wait=False, model=None, worker_id="gw-worker",
                           kv_cache_memory="64MiB")
    yield factory, worker
    factory.cleanup()


@pytest.fixture(scope="session")
def gateway_url(fleet_redis, fleet_worker, tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("gateway")
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps({"keys": KEYS, "quotas": {
        "limited": {"requests_per_minute": 2}, "single": {"max_concurrent": 1}}}))
    port = free_port()
    log = tmp / "gateway.log"
    cmd = [sys.executable, "-m", "producer.cli", "gateway", "--redis-url", fleet_redis.url,
           "--port", str(port), "--served-model", "smol=default", "--served-model", "idle",
           "--api-keys", str(keys_file), "--max-queue", str(QUEUE_BOUND), "--retry-after", "7",
           "--tokenizer", str(model_dir), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/health", proc, log)
    factory, worker = fleet_worker
    factory.wait_ready(worker)  # the worker loads the model meanwhile
    yield url
    proc.terminate()
    proc.wait(15)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gateway did not start:\n{log.read_text()}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def openai_client(gateway_url):
    from openai import OpenAI

    client = OpenAI(base_url=gateway_url + "/v1", api_key="sk-acme", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="session")
def offline():
    """Greedy text of the offline API (``LLM().generate``) for a prompt, computed once."""
    from gpu_worker import LLM, SamplingParams

    llm = LLM(num_threads=1)  # the worker runs with OMP_NUM_THREADS=1 as well
    cache = {}

    def generate(prompt, max_tokens: int) -> str:
        key = (json.dumps(prompt), max_tokens)
        if key not in cache:
            out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
            cache[key] = out[0].text
        return cache[key]

    return generate
