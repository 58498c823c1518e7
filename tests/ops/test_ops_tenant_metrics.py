"""Per-tenant worker metrics: held requests and generated tokens, with bounded labels."""
from __future__ import annotations

from types import SimpleNamespace

from gpu_worker import metrics as m
from gpu_worker.metrics import WorkerMetrics


def _value(reg, name, **labels):
    return reg.get_sample_value(name, labels)


def test_held_requests_and_tokens_by_tenant():
    w = WorkerMetrics("default")
    inflight = {f"{t}/{i}": SimpleNamespace(tenant=t) for t in ("acme", "globex") for i in range(2)}
    inflight["acme/2"] = SimpleNamespace(tenant="acme")
    w.on_held(inflight)
    assert _value(w.registry, "fleet:tenant_requests_held", model_name="default", tenant="acme") == 3
    w.on_held({})
    assert _value(w.registry, "fleet:tenant_requests_held", model_name="default", tenant="acme") == 0
    w.tenant_tokens.labels("default", w.tenant_label("globex")).inc(5)
    assert _value(w.registry, "fleet:tenant_generation_tokens_total", model_name="default",
                  tenant="globex") == 5


def test_labels_stay_bounded(monkeypatch):
    monkeypatch.setattr(m, "MAX_TENANT_LABELS", 3)
    w = WorkerMetrics("default")
    labels = {w.tenant_label(f"t{i}") for i in range(50)}
    assert labels == {"t0", "t1", "t2", "_other"}
