"""The compose stack brought up without containers (no Docker daemon here): the worker,
gateway and exporter run their compose commands as processes on a real redis-server,
each passes the image's HEALTHCHECK command, and Prometheus, with the compose
prometheus.yml and the fleet's alert rules, scrapes all three and sees a request's tokens.
Changed from the compose file, and only this: ports are free ones on 127.0.0.1, the worker
serves a tiny random model instead of the embedded one, and Prometheus scrapes every second."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from redis_server import REPO, free_port, subprocess_env

from producer import FleetClient
from tests.ops.test_ops_deploy_image import COMPOSE, COMPOSE_DIR, _healthcheck

PORT_FLAGS = {"worker": "--metrics-port", "gateway": "--port", "exporter": "--port"}


def _command(name: str, service: dict, port: int, redis_url: str, model: str) -> list[str]:
    args = list(service["command"])
    args[args.index(PORT_FLAGS[name]) + 1] = str(port)
    if "--host" in args:
        args[args.index("--host") + 1] = "127.0.0.1"
    if name == "worker":
        args += ["--metrics-host", "127.0.0.1", "--model", model, "--kv-cache-memory", "8MiB"]
    return [sys.executable, "-m", "producer.cli", *args, "--redis-url", redis_url]  # the image's `fleet`


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _healthy(service: dict, port: int, default_port: int) -> bool:
    url = service.get("environment", {}).get("FLEET_HEALTH_URL", "http://127.0.0.1:9300/healthz")
    url = url.replace(f":{default_port}/", f":{port}/")
    cmd = _healthcheck()
    env = subprocess_env(FLEET_HEALTH_URL=url)
    return subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_the_compose_stack_serves_and_is_scraped(redis_server, tiny_model, tmp_path):
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    ports = {name: free_port() for name in PORT_FLAGS}
    procs = []
    try:
        for name in PORT_FLAGS:
            log = (tmp_path / f"{name}.log").open("w")
            procs.append(subprocess.Popen(_command(name, services[name], ports[name], redis_server.url, tiny_model),
                                          cwd=REPO, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT))
        for name in PORT_FLAGS:
            default = int(services[name]["command"][services[name]["command"].index(PORT_FLAGS[name]) + 1])
            _until(lambda: _healthy(services[name], ports[name], default), 120, f"{name}'s health check")
        config = (COMPOSE_DIR / "prometheus.yml").read_text().replace("scrape_interval: 15s", "scrape_interval: 1s")
        for name in PORT_FLAGS:
            default = services[name]["command"][services[name]["command"].index(PORT_FLAGS[name]) + 1]
            config = config.replace(f'"{name}:{default}"', f'"127.0.0.1:{ports[name]}"')
        (tmp_path / "prometheus.yml").write_text(config)
        shutil.copy(REPO / "ops" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
        prom_port = free_port()
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def all_up():
            targets = _get(f"{api}/targets")["data"]["activeTargets"]
            return len(targets) == 3 and all(t["health"] == "up" for t in targets) and targets

        jobs = {t["labels"]["job"] for t in _until(all_up, 60, "every target up")}
        assert jobs == {"fleet-worker", "fleet-exporter", "fleet-gateway"}
        groups = {g["name"] for g in _get(f"{api}/rules")["data"]["groups"]}
        assert groups == {g["name"] for g in yaml.safe_load((REPO / "ops/prometheus/alerts.yml").read_text())["groups"]}
        with FleetClient(redis_server.url) as fleet:
            result = fleet.generate(prompt_token_ids=[1, 5, 9], max_tokens=5, temperature=0.0,
                                    ignore_eos=True, timeout=60)
        assert len(result.token_ids) == 5
        query = f"{api}/query?query=sum(fleet:generation_tokens_total)"
        _until(lambda: (r := _get(query)["data"]["result"]) and float(r[0]["value"][1]) >= 5, 30,
               "the worker's tokens in Prometheus")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
