"""Stand-ins for ``kubectl``, ``docker``, ``helm`` and ``curl`` while the README's "Operating
it" commands run (tests/ops/test_ops_deploy_readme.py): each checks what can be checked
without a cluster or a registry, logs the call, and fails (exit 1) on anything wrong.

    python readme_shims.py TOOL ARGS...    (env: SHIM_DIR, REAL_KUBECTL, SHIM_OPS)
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SHIM_DIR = Path(os.environ.get("SHIM_DIR", "."))
KINDS = {"job": "Job", "statefulset": "StatefulSet", "deployment": "Deployment", "svc": "Service",
         "scaledobject": "ScaledObject", "prometheusrule": "PrometheusRule"}


def _validate():
    path = Path(os.environ["SHIM_OPS"]) / "kustomize" / "validate.py"
    spec = importlib.util.spec_from_file_location("validate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fail(message: str) -> None:
    sys.stderr.write(f"shim: {message}\n")
    sys.exit(1)


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _rendered() -> list[dict]:
    validate = _validate()
    return validate.render(validate.TARGETS["gpu"])


def _has(kind: str, name: str) -> bool:
    return any(d["kind"] == kind and d["metadata"]["name"] == name for d in _rendered())


def _start_redis(port: int) -> None:
    """What `port-forward svc/redis` gives: the TLS Redis the README's files describe."""
    cwd = Path.cwd()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cwd / "tls.crt"), "--tls-key-file", str(cwd / "tls.key"),
                             "--tls-ca-cert-file", str(cwd / "ca.crt"), "--tls-auth-clients", "no", "--aclfile", str(cwd / "users.acl"),
                             "--save", "", "--appendonly", "no", "--dir", str(SHIM_DIR)],
                            stdout=open(SHIM_DIR / "redis.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    (SHIM_DIR / "redis.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail("redis-server did not start with the README's files: " + (SHIM_DIR / "redis.log").read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    fail("redis-server did not answer")


def kubectl(args: list[str]) -> None:
    if args[:1] in (["kustomize"], ["version"]):  # rendering (ops/kustomize/validate.py) is real
        os.execv(os.environ["REAL_KUBECTL"], ["kubectl", *args])
    namespace = _flag(args, "-n") or _flag(args, "--namespace")
    rest = [a for i, a in enumerate(args) if a not in ("-n", "--namespace")
            and (i == 0 or args[i - 1] not in ("-n", "--namespace"))]
    verb = rest[0]
    validate = _validate()
    if verb == "apply":
        target = rest[2]
        docs = (validate.render(Path(target)) if rest[1] == "-k"
                else [d for d in __import__("yaml").safe_load_all(Path(target).read_text()) if d])
        validate.validate(docs)
    elif verb == "create":
        out = subprocess.run([os.environ["REAL_KUBECTL"], *args, "--dry-run=client", "-o", "json"],
                             capture_output=True, text=True)
        if out.returncode:
            fail(out.stderr)
        made = json.loads(out.stdout)
        (SHIM_DIR / "created").mkdir(exist_ok=True)
        (SHIM_DIR / "created" / f"{made['kind']}-{made['metadata']['name']}.json").write_text(out.stdout)
    elif namespace == "monitoring" and verb in ("port-forward", "label"):
        created = SHIM_DIR / "created" / f"ConfigMap-{rest[2]}.json"
        if verb == "label" and not created.exists():
            fail(f"label on a ConfigMap never created: {rest[2]}")
    elif namespace != "fleet":
        fail(f"unexpected namespace {namespace}")
    else:
        _check_fleet_object(verb, rest)


def _check_fleet_object(verb: str, rest: list[str]) -> None:
    if verb in ("wait", "rollout", "port-forward"):
        ref = next(a for a in rest[1:] if "/" in a and not a.startswith("--"))
        kind, name = ref.split("/", 1)
        if not _has(KINDS[kind], name):
            fail(f"{ref} is not in the rendered fleet")
        if verb == "port-forward":
            local, remote = rest[-1].split(":")
            service = next(d for d in _rendered() if d["kind"] == "Service" and d["metadata"]["name"] == name)
            if int(remote) not in [p["port"] for p in service["spec"]["ports"]]:
                fail(f"{ref} has no port {remote}")
            if name == "redis":
                _start_redis(int(local))
    elif verb == "get" and rest[1] == "pods":
        selector = dict([rest[rest.index("-l") + 1].split("=")])
        pods = [d["spec"]["template"]["metadata"]["labels"] for d in _rendered() if d["kind"] == "Deployment"]
        if not any(selector.items() <= labels.items() for labels in pods):
            fail(f"no pods match {selector}")
    elif verb == "get" and rest[1] == "hpa":
        if not (rest[2].startswith("keda-hpa-") and _has("ScaledObject", rest[2][len("keda-hpa-"):])):
            fail(f"KEDA makes no HPA named {rest[2]}")
    elif verb == "get":
        if not _has(KINDS[rest[1]], rest[2]):
            fail(f"{rest[1]} {rest[2]} is not in the rendered fleet")
    else:
        fail(f"unexpected kubectl {verb}")


def docker(args: list[str]) -> None:
    if args[0] == "build":
        dockerfile, context = Path(_flag(args, "-f")), Path(args[-1])
        if not dockerfile.exists() or not context.is_dir() or not _flag(args, "-t"):
            fail(f"docker build: {dockerfile} / {context}")
    elif args[0] != "push" or len(args) != 2 or ":" not in args[1]:
        fail(f"unexpected docker {args}")


def helm(args: list[str]) -> None:
    if args[:2] == ["repo", "add"]:
        if not args[3].startswith("https://"):
            fail(f"helm repo add {args[3]}")
    elif args[0] != "install" or _flag(args, "--namespace") is None:
        fail(f"unexpected helm {args}")


def main() -> None:
    tool, args = sys.argv[1], sys.argv[2:]
    with open(SHIM_DIR / "calls.jsonl", "a") as log:
        log.write(json.dumps([tool, *args]) + "\n")
    {"kubectl": kubectl, "docker": docker, "helm": helm, "curl": lambda a: None}[tool](args)


if __name__ == "__main__":
    main()
