"""README "Operating it", run as written: the block of commands goes through bash in a copy
of ops/, with kubectl, docker, helm and curl replaced by checking stand-ins
(tests/ops/readme_shims.py). openssl, envsubst, the Python tools and `fleet` run for real;
`port-forward svc/redis` starts a TLS redis-server from the certificates and the ACL file
the commands made, so `fleet` connects as fleet-admin, verifying the server with the CA."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from redis_server import REPO, free_port

from tests.ops.test_ops_deploy import _kustomize_usable

SHIMS = Path(__file__).with_name("readme_shims.py")
TOOLS = ("kubectl", "docker", "helm", "curl")


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Operating it\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def _commands(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_every_command_of_the_section_is_one_the_stand_ins_know():
    for line in _commands(readme_block()):
        word = line.split()[0]
        known = TOOLS + ("openssl", "printf", "envsubst", "export", "for", "sed", ".venv/bin/python",
                         ".venv/bin/fleet", "DOCKER_BUILDKIT=1", "users=$(grep")
        assert word in known, line


def _referenced_secrets(docs: list[dict]) -> set[tuple[str, str | None]]:
    """(secret, key) every object reads; key None: the whole secret is mounted."""
    found: set[tuple[str, str | None]] = set()
    for doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    found.add((ref["name"], ref["key"]))
        found |= {(v["secret"]["secretName"], None) for v in pod.get("volumes", []) if "secret" in v}
        for ref in doc.get("spec", {}).get("secretTargetRef", []) if doc["kind"] == "TriggerAuthentication" else []:
            found.add((ref["name"], ref["key"]))
    return found


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("operating")
    why = _kustomize_usable()
    if why or not all(shutil.which(t) for t in ("openssl", "envsubst", "redis-server")):
        pytest.skip(why or "needs openssl, envsubst (gettext-base) and redis-server")
    pytest.importorskip("kubernetes_validate")
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    shutil.copytree(REPO / "ops", work / "ops", ignore=shutil.ignore_patterns("__pycache__"))
    (work / ".venv").symlink_to(REPO / ".venv")
    (work / "Llama-3.1-8B-Instruct").mkdir()
    (work / "Llama-3.1-8B-Instruct" / "config.json").write_text("{}")
    bin_dir.mkdir()
    for tool in TOOLS:
        shim = bin_dir / tool
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SHIMS}" {tool} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    port = free_port()
    # Port-forwards run in the foreground, so a failing one fails the script: the stand-ins
    # return at once (the Redis one once Redis answers).
    script = re.sub(r" &$", "", readme_block().replace("6380", str(port)), flags=re.M)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_DIR": str(tmp_path),
           "SHIM_OPS": str(work / "ops"), "REAL_KUBECTL": shutil.which("kubectl"),
           "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    env.pop("REDIS_URL", None)
    try:
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                              capture_output=True, text=True, timeout=240)
    finally:
        pid_file = tmp_path / "redis.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
    return done, work, tmp_path


def test_the_operating_section_runs_from_an_empty_cluster_to_dashboards(ran):
    done, work, shim_dir = ran
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    calls = [json.loads(line) for line in (shim_dir / "calls.jsonl").read_text().splitlines()]
    assert ["kubectl", "apply", "-k", "ops/kustomize/overlays/gpu"] in calls
    assert sum(c[0] == "docker" for c in calls) == 4 and sum(c[0] == "helm" for c in calls) == 4
    assert "acme" in done.stdout  # fleet tenants list, through TLS as fleet-admin
    users = (work / "users.acl").read_text()
    enabled = [line for line in users.splitlines() if line.startswith("user ") and " on " in line]
    assert enabled and all(re.search(r" on #[0-9a-f]{64} ", line) for line in enabled)  # every hash set
    gpu = (work / "ops/kustomize/overlays/gpu/kustomization.yaml").read_text()
    assert "registry.example.com" in gpu  # the example registry stays the example's


def test_the_operating_section_creates_every_secret_and_key_the_manifests_read(ran):
    done, work, shim_dir = ran
    assert done.returncode == 0, done.stderr[-3000:]
    created = {}
    for path in (shim_dir / "created").glob("*.json"):
        obj = json.loads(path.read_text())
        created[(obj["kind"], obj["metadata"]["name"])] = set(obj.get("data", {}))
    sys.path.insert(0, str(work / "ops" / "kustomize"))
    import validate

    sys.path.pop(0)
    docs = [d for name in ("gpu", "redis-cluster") for d in validate.render(validate.TARGETS[name])]
    for secret, key in _referenced_secrets(docs):
        assert ("Secret", secret) in created, secret
        if key:
            assert key in created[("Secret", secret)], (secret, key)
    redis = next(d for d in docs if d["kind"] == "StatefulSet")
    config = next(v["configMap"]["name"] for v in redis["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
    assert created[("ConfigMap", config)] == {"redis.conf"}
    api_keys = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fleet-gateway")
    assert "--api-keys" in yaml.safe_dump(api_keys)
    assert created[("ConfigMap", "fleet-dashboard")] == {"fleet-dashboard.json"}
