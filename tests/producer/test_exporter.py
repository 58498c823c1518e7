"""``fleet exporter`` with tenants: a ``tenant`` label of bounded cardinality, the total
backlog the autoscaler reads, consumer groups created on each tenant's allowed lanes only,
and the real process serving /metrics from a Redis Cluster given one node's URL."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis_server import REPO, free_port, subprocess_env, wait_until

from producer.exporter import QueueCollector
from shared import keys, tenants
from shared.tenants import TenantConfig
from tests.redis_cluster import RedisCluster


def _samples(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families for s in f.samples}


def _register(client, *configs: TenantConfig) -> None:
    for config in configs:
        client.hset(keys.tenants_key(), config.name, tenants.encode(config))


def _lag(samples, tenant: str, lane: str) -> float:
    return samples[("fleet:stream_lag", (("lane", lane), ("model_name", "default"),
                                         ("tenant", tenant)))]


def test_tenant_labels_are_bounded_and_the_backlog_counts_everyone(redis_server, r):
    names = ["t1", "t2", "t3", "t4", "t5"]
    _register(r, *(TenantConfig(name=n, lanes=["default"]) for n in names))
    for i, name in enumerate(names):
        for _ in range(i + 1):  # t1: 1 waiting ... t5: 5
            r.xadd(keys.stream_key("default", name, "default"), {keys.STREAM_FIELD: b"{}"})
    r.xadd(keys.legacy_stream_key("default", "batch"), {keys.STREAM_FIELD: b"{}"})
    samples = _samples(QueueCollector(redis_server.url, ["default"], max_tenants=2).collect())
    labelled = {dict(lbl)["tenant"] for (name, lbl) in samples if name == "fleet:stream_lag"}
    assert labelled == {"t1", "t2", "_other", "_legacy"}
    assert (_lag(samples, "t1", "default"), _lag(samples, "t2", "default")) == (1, 2)
    assert _lag(samples, "_other", "default") == 3 + 4 + 5
    assert _lag(samples, "_legacy", "batch") == 1
    assert samples[("fleet:queue_backlog", (("model_name", "default"),))] == 16
    assert samples[("fleet:tenant_backlog", (("model_name", "default"), ("tenant", "_other")))] == 12
    assert samples[("fleet:tenants_registered", ())] == 5
    assert samples[("fleet:queue_up", ())] == 1


def test_groups_are_created_on_allowed_lanes_only(redis_server, r):
    _register(r, TenantConfig(name="acme", lanes=["high", "default"]))
    early = keys.stream_key("default", "acme", "default")
    r.xadd(early, {keys.STREAM_FIELD: b"{}"})  # enqueued before any group existed
    samples = _samples(QueueCollector(redis_server.url, ["default"]).collect())
    assert _lag(samples, "acme", "default") == 1  # the group starts at 0, not at $
    assert [g["name"] for g in r.xinfo_groups(keys.stream_key("default", "acme", "high"))] == [b"workers"]
    assert not r.exists(keys.stream_key("default", "acme", "batch"))
    assert not any(r.exists(keys.legacy_stream_key("default", lane)) for lane in keys.LANES)
    read_only = QueueCollector(redis_server.url, ["other"], ensure=False)
    list(read_only.collect())
    assert not r.exists(keys.stream_key("other", "acme", "high"))


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster().start()
    yield c
    c.stop()


def test_the_exporter_process_reads_a_cluster(cluster):
    with cluster.client() as client:
        _register(client, TenantConfig(name="acme"), TenantConfig(name="globex"))
        for tenant in ("acme", "globex"):
            client.xadd(keys.stream_key("default", tenant, "batch"), {keys.STREAM_FIELD: b"{}"})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "producer.cli", "exporter", "--redis-url",
                             cluster.nodes[-1].url, "--port", str(port), "--host", "127.0.0.1"],
                            cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        def scrape():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                    return reply.read().decode()
            except OSError:
                return None

        text = wait_until(scrape, timeout=30, what="the exporter's /metrics")
        samples = _samples(text_string_to_metric_families(text))
        assert samples[("fleet:queue_up", ())] == 1
        assert samples[("fleet:queue_backlog", (("model_name", "default"),))] == 2
        assert _lag(samples, "globex", "batch") == 1
        with cluster.client() as client:  # the groups of both tenants' lanes, in their slots
            assert client.xinfo_groups(keys.stream_key("default", "acme", "default"))
    finally:
        proc.terminate()
        proc.wait(10)


def _prom_query(base: str, expr: str) -> list | None:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["data"]["result"]
    except OSError:
        return None


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_the_keda_queries_read_the_backlog_through_a_real_prometheus(redis_server, r, tmp_path):
    """The shipped ScaledObject's queries, as KEDA would run them: every tenant's backlog,
    the high lane's lag, and nothing at all (an error to KEDA, so it falls back instead of
    scaling to zero) once the queue cannot be read."""
    spec = next(d for d in yaml.safe_load_all((REPO / "ops/k8s/keda-scaledobject.yaml").read_text())
                if d and d["kind"] == "ScaledObject")["spec"]
    queries = {t["name"]: t["metadata"]["query"] for t in spec["triggers"]}
    _register(r, TenantConfig(name="acme", lanes=["high", "default"]), TenantConfig(name="globex"))
    for stream in (keys.stream_key("default", "acme", "high"),
                   keys.stream_key("default", "globex", "batch"),
                   keys.stream_key("default", "globex", "batch")):
        r.xadd(stream, {keys.STREAM_FIELD: b"{}"})
    exporter_port, prom_port = free_port(), free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "producer.cli", "exporter", "--redis-url",
                                 redis_server.url, "--port", str(exporter_port), "--host",
                                 "127.0.0.1"], cwd=REPO, env=subprocess_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: fleet-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        def value(name: str) -> float | None:
            result = _prom_query(base, queries[name])
            return float(result[0]["value"][1]) if result else None

        wait_until(lambda: value("backlog") == 3, timeout=60, what="the backlog in Prometheus")
        assert value("lag-high") == 1
        r.delete(keys.stream_key("default", "acme", "high"))
        wait_until(lambda: value("lag-high") == 0, timeout=30, what="no high lag")
        redis_server.kill()  # the exporter answers queue_up 0 and no backlog
        wait_until(lambda: value("backlog") is None, timeout=30, what="no backlog at all")
        assert value("lag-high") == 0
    finally:
        for proc in (prom, exporter):
            proc.terminate()
            proc.wait(15)
