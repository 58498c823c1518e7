"""The deployment as kustomize renders it: every overlay renders and every object validates
(Kubernetes' schemas, KEDA's and prometheus-operator's from ops/kustomize/schemas/); the
model reaches the worker's volume and the worker's flags parse with the real CLI; KEDA
reaches the Redis Cluster over TLS with the CA; the PrometheusRule is the alerts file."""
from __future__ import annotations

import copy
import importlib.util
import os
import re
import shutil
import subprocess

import pytest
import yaml
from redis_server import REPO

from gpu_worker.cli import build_parser as engine_parser

K8S = REPO / "ops" / "k8s"


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate = _load(REPO / "ops" / "kustomize" / "validate.py")
rules = _load(K8S / "build_prometheusrule.py")


def _kustomize_usable() -> str | None:
    try:
        cmd = validate.kustomize_command(K8S)
    except validate.ToolMissing as exc:
        return str(exc)
    if cmd[0] == "kubectl":
        out = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout
        found = re.search(r"Kustomize Version: v(\d+)", out)
        if not found or int(found.group(1)) < 4:
            return f"kubectl's kustomize is older than v4 ({out.strip()!r})"
    return None


needs_kustomize = pytest.mark.skipif(_kustomize_usable() is not None,
                                     reason=f"no usable kustomize: {_kustomize_usable()}")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    if _kustomize_usable() is not None:
        pytest.skip(f"no usable kustomize: {_kustomize_usable()}")
    return {name: validate.render(path) for name, path in validate.TARGETS.items()}


def _one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _worker(docs) -> dict:
    return _one(docs, "Deployment", "fleet-worker")["spec"]["template"]["spec"]


def _env(container, name):
    return next(e["value"] for e in container["env"] if e["name"] == name)


@needs_kustomize
def test_every_overlay_renders_and_every_object_validates(rendered):
    pytest.importorskip("kubernetes_validate")
    for name, docs in rendered.items():
        assert validate.validate(docs) >= 14, name
        kinds = {d["kind"] for d in docs}
        assert {"ScaledObject", "PodMonitor", "ServiceMonitor", "PrometheusRule"} <= kinds, name


def test_the_custom_schemas_reject_typos_and_bad_values():
    doc = next(d for d in yaml.safe_load_all((K8S / "keda-scaledobject.yaml").read_text()) if d)
    validate.validate_custom(doc)
    import jsonschema

    for break_it in (lambda d: d["spec"].update(minReplicas=0),  # the field is minReplicaCount
                     lambda d: d["spec"]["triggers"][0].pop("metadata"),
                     lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=64),  # not a string
                     lambda d: d["spec"]["fallback"].update(replicas="2")):
        bad = copy.deepcopy(doc)
        break_it(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate.validate_custom(bad)
    monitor = yaml.safe_load((K8S / "monitoring.yaml").read_text().split("---")[0])
    monitor["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate.validate_custom(monitor)


def test_an_unknown_custom_kind_is_not_waved_through():
    pytest.importorskip("kubernetes_validate")
    with pytest.raises(ValueError, match="no schema"):
        validate.validate([{"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "x"}}])


@needs_kustomize
def test_workers_load_the_model_the_job_puts_on_the_volume(rendered):
    for name in ("base", "gpu", "redis-cluster"):
        docs = rendered[name]
        pod = _worker(docs)
        (worker,) = pod["containers"]
        args = engine_parser().parse_args(worker["args"])  # a renamed flag fails here
        assert args.device == "cuda" and args.dtype == "bfloat16"
        (wait,) = pod["initContainers"]
        assert _env(wait, "MODEL_DIR") == args.model and "$MODEL_DIR/.complete" in wait["command"][-1]
        job = _one(docs, "Job", "fleet-model-load")["spec"]["template"]["spec"]
        (copy_,) = job["containers"]
        assert _env(copy_, "MODEL_DIR") == args.model
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName")
                  for v in pod["volumes"] + job["volumes"]}
        mounts = {m["name"]: m["mountPath"] for c in (worker, wait, copy_) for m in c["volumeMounts"]}
        assert claims["models"] == "fleet-models" and mounts["models"] == "/models"
        assert args.model.startswith("/models/")
        assert copy_["image"].rpartition(":")[0].endswith("fleet-model")
    cpu = engine_parser().parse_args(_worker(rendered["cpu"])["containers"][0]["args"])
    assert cpu.device == "cpu" and cpu.model is None  # the embedded model
    gpu = engine_parser().parse_args(_worker(rendered["gpu"])["containers"][0]["args"])
    device_only = {"model", "device", "dtype", "threads"}
    assert {k: v for k, v in vars(cpu).items() if k not in device_only} == \
        {k: v for k, v in vars(gpu).items() if k not in device_only}  # the overlay's copy kept in step
    assert "initContainers" not in _worker(rendered["cpu"])
    assert "nvidia.com/gpu" not in str(_worker(rendered["cpu"])["containers"][0]["resources"])
    assert not [d for d in rendered["cpu"] if d["kind"] == "Job"]


def _job_script() -> str:
    job = next(d for d in yaml.safe_load_all((K8S / "model-job.yaml").read_text()) if d)
    return job["spec"]["template"]["spec"]["containers"][0]["args"][0]


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_the_model_job_copies_once_and_refuses_a_directory_without_a_model(tmp_path):
    src, dst = tmp_path / "image-model", tmp_path / "models" / "M"
    src.mkdir()
    (tmp_path / "models").mkdir()
    env = {**os.environ, "MODEL_SRC": str(src), "MODEL_DIR": str(dst)}
    run = lambda: subprocess.run(["sh", "-c", _job_script()], env=env, capture_output=True, text=True)  # noqa: E731
    done = run()
    assert done.returncode != 0 and "no config.json" in done.stderr and not dst.exists()
    (src / "config.json").write_text("{}")
    (src / "sub").mkdir()
    (src / "sub" / "w.safetensors").write_bytes(b"x" * 10)
    assert run().returncode == 0
    assert (dst / "config.json").exists() and (dst / "sub" / "w.safetensors").read_bytes() == b"x" * 10
    assert (dst / ".complete").exists() and not (tmp_path / "models" / "M.incoming").exists()
    (src / "config.json").write_text('{"changed": 1}')
    again = run()
    assert again.returncode == 0 and "is complete" in again.stdout
    assert (dst / "config.json").read_text() == "{}"  # a complete model is left alone
    (dst / ".complete").unlink()  # a directory someone else put there: never deleted
    refused = run()
    assert refused.returncode != 0 and "not marked complete" in refused.stderr
    assert (dst / "config.json").read_text() == "{}"


@needs_kustomize
def test_keda_reaches_the_redis_cluster_over_tls_with_the_ca(rendered):
    docs = rendered["redis-cluster"]
    scaled = _one(docs, "ScaledObject")
    auth = _one(docs, "TriggerAuthentication")
    params = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert params["ca"] == ("fleet-redis-tls", "ca.crt") and params["tls"][1] == "keda-tls"
    secrets = {d["metadata"]["name"]: d["stringData"]
               for d in yaml.safe_load_all((K8S / "secrets.example.yaml").read_text()) if d}
    assert all(key in secrets[name] for name, key in params.values())
    assert secrets[params["tls"][0]][params["tls"][1]] == "enable"  # what KEDA's redis scaler reads
    for trigger in scaled["spec"]["triggers"]:
        assert "enableTLS" not in trigger["metadata"]  # KEDA refuses it beside the auth's tls
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    mounted = {v["secret"]["secretName"] for v in _worker(docs)["volumes"] if "secret" in v}
    assert "fleet-redis-tls" in mounted  # the same CA the fleet's pods verify Redis with
    assert not [d for d in docs if d["kind"] == "StatefulSet"]  # no single Redis beside a cluster


@needs_kustomize
def test_monitors_select_the_pods_and_ports_that_serve_metrics(rendered):
    docs = rendered["base"]
    pod_monitor = _one(docs, "PodMonitor")
    worker = _one(docs, "Deployment", "fleet-worker")["spec"]["template"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    ports = {p["name"] for p in worker["spec"]["containers"][0]["ports"]}
    assert {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]} <= ports
    endpoints = list(pod_monitor["spec"]["podMetricsEndpoints"])
    for name in ("fleet-exporter", "fleet-gateway"):  # both serve /metrics on their port
        monitor, service = _one(docs, "ServiceMonitor", name), _one(docs, "Service", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
        endpoints += monitor["spec"]["endpoints"]
    assert {e["path"] for e in endpoints} == {"/metrics"}
    app = (REPO / "producer" / "gateway" / "app.py").read_text()
    assert 'Route("/metrics"' in app


def test_the_prometheus_rule_carries_exactly_the_alerts_file():
    alerts = yaml.safe_load((REPO / "ops" / "prometheus" / "alerts.yml").read_text())
    assert (K8S / "prometheusrule.yaml").read_text() == rules.render(), \
        "ops/k8s/prometheusrule.yaml is stale: run .venv/bin/python ops/k8s/build_prometheusrule.py"
    shipped = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    assert shipped["spec"]["groups"] == alerts["groups"]
    validate.validate_custom(shipped)
    changed = (REPO / "ops" / "prometheus" / "alerts.yml").read_text().replace("for: 5m", "for: 6m", 1)
    assert rules.render(changed) != rules.render()  # a changed rule changes the rendered one


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_prometheus_rule_groups_pass_promtool(tmp_path):
    shipped = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": shipped["spec"]["groups"]}))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_base_lists_every_manifest_but_the_secrets_example():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secrets.example.yaml"}
    assert listed == files
