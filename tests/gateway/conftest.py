"""One fleet for the whole gateway suite: a real redis-server, one real worker on the
embedded SmolLM2-135M-Instruct, and ``fleet gateway`` itself as a subprocess. (The fuzz and
ACL tests run fleets of their own, on the tiny random model.)

The gateway serves ``smol`` (the worker's namespace) and ``idle`` (a namespace no worker
serves, so its queues only fill). Tenants, registered with ``fleet tenants add``: ``acme``
and ``globex`` (no quota), ``limited`` (2 requests a minute), ``single`` (1 request in
flight), ``batchonly`` (lane batch only: the gateway's lane is refused); the key
``sk-ghost`` names a tenant that is not registered.
"""
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fleet_harness import WorkerFactory, tiny_model  # noqa: E402,F401
from gateway_harness import GatewayProcess, register_tenants, start_gateway  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402

KEYS = {"sk-acme": "acme", "sk-globex": "globex", "sk-limited": "limited",
        "sk-single": "single", "sk-batchonly": "batchonly", "sk-ghost": "ghost"}
QUEUE_BOUND = 3


@pytest.fixture(scope="session")
def fleet_redis():
    server = RedisServer().start()
    register_tenants(server.url, "acme", "globex", "limited", "single")
    register_tenants(server.url, "batchonly", lanes="batch")
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
def gateway(fleet_redis, fleet_worker, tmp_path_factory, model_dir) -> GatewayProcess:
    tmp = tmp_path_factory.mktemp("gateway")
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps({"keys": KEYS, "quotas": {
        "limited": {"requests_per_minute": 2}, "single": {"max_concurrent": 1}}}))
    gateway = start_gateway(
        fleet_redis.url, tmp / "gateway.log", free_port(), "--served-model", "smol=default",
        "--served-model", "idle", "--api-keys", str(keys_file), "--max-queue", str(QUEUE_BOUND),
        "--retry-after", "7", "--tokenizer", str(model_dir))
    factory, worker = fleet_worker
    factory.wait_ready(worker)  # the worker loads the model meanwhile
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def gateway_url(gateway) -> str:
    return gateway.url


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
