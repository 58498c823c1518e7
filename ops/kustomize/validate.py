"""Renders the Kubernetes base and every overlay with kustomize and validates each object
offline: core kinds against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
an unknown field fails), KEDA and prometheus-operator kinds against the JSON Schemas in
ops/kustomize/schemas/ (written from their documented fields; unknown fields fail too).

    .venv/bin/python ops/kustomize/validate.py        # before every `kubectl apply -k`
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
OPS = HERE.parent
TARGETS = {"base": OPS / "k8s", "gpu": HERE / "overlays" / "gpu", "cpu": HERE / "overlays" / "cpu",
           "redis-cluster": HERE / "overlays" / "redis-cluster"}
SCHEMAS = {"ScaledObject": "scaledobject.json", "TriggerAuthentication": "triggerauthentication.json",
           "PodMonitor": "podmonitor.json", "ServiceMonitor": "servicemonitor.json",
           "PrometheusRule": "prometheusrule.json"}


class ToolMissing(RuntimeError):
    """Neither `kubectl` (with its built-in kustomize) nor `kustomize` is on PATH."""


def kustomize_command(path: Path) -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize", str(path)]
    if shutil.which("kustomize"):
        return ["kustomize", "build", str(path)]
    raise ToolMissing("install kubectl (Debian: kubernetes-client) or kustomize")


def render(path: Path) -> list[dict]:
    done = subprocess.run(kustomize_command(path), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ValueError(f"kustomize {path}: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _registry():
    from referencing import Registry, Resource

    resources = [(p.name, Resource.from_contents(json.loads(p.read_text())))
                 for p in (HERE / "schemas").glob("*.json")]
    return Registry().with_resources(resources)


def validate_custom(doc: dict, registry=None) -> None:
    """Raises jsonschema.ValidationError for a custom resource that breaks its schema."""
    import jsonschema

    registry = registry if registry is not None else _registry()
    schema = json.loads((HERE / "schemas" / SCHEMAS[doc["kind"]]).read_text())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


def validate(docs: list[dict]) -> int:
    """Validates every object; a kind neither Kubernetes nor this repo has a schema for fails."""
    import kubernetes_validate as kv

    registry, version = _registry(), kv.latest_version()
    for doc in docs:
        if doc["kind"] in SCHEMAS:
            validate_custom(doc, registry)
        elif "." in (group := doc["apiVersion"].rpartition("/")[0]) and not group.endswith(".k8s.io"):
            raise ValueError(f"no schema for {doc['apiVersion']} {doc['kind']}")
        else:
            kv.validate(doc, version, strict=True)
    return len(docs)


def main() -> int:
    for name, path in TARGETS.items():
        print(f"{name}: {validate(render(path))} objects valid ({path.relative_to(OPS.parent)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
