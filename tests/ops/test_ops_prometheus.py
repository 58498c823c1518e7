"""Prometheus: the rules and config pass promtool (alerts fire in its unit tests), and a real
Prometheus scrapes a real worker and the exporter. Skipped where the binaries are absent
(ops/ci_extras.sh installs Debian's ``prometheus`` package)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse

import pytest
from ops_harness import http_get
from redis_server import REPO, free_port, subprocess_env, wait_until

from producer import FleetClient

PROM = REPO / "ops" / "prometheus"
promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def _promtool(*args: str) -> str:
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@promtool
def test_alert_rules_pass_promtool_and_fire_in_its_unit_tests():
    assert "SUCCESS" in _promtool("check", "rules", str(PROM / "alerts.yml"))
    assert "SUCCESS" in _promtool("test", "rules", str(PROM / "alerts_test.yml"))


@promtool
def test_scrape_config_passes_promtool():
    _promtool("check", "config", str(PROM / "prometheus.yml"))


def _query(base: str, expr: str) -> float | None:
    status, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}")
    if status != 200:
        return None
    result = json.loads(body)["data"]["result"]
    return sum(float(r["value"][1]) for r in result) if result else None


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_real_prometheus_scrapes_a_worker_and_the_exporter(workers, redis_server, tmp_path):
    worker_port, exporter_port, prom_port = free_port(), free_port(), free_port()
    workers.start(metrics_port=worker_port, metrics_host="127.0.0.1")
    exporter = subprocess.Popen(
        [sys.executable, "-m", "producer.cli", "exporter", "--redis-url", redis_server.url,
         "--port", str(exporter_port), "--host", "127.0.0.1"],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: fleet-worker
    static_configs: [{{targets: ["127.0.0.1:{worker_port}"]}}]
  - job_name: fleet-exporter
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
""")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        with FleetClient(redis_server.url) as fleet:
            result = fleet.generate(prompt_token_ids=[1, 2, 3], max_tokens=9, temperature=0.0,
                                    ignore_eos=True, timeout=60)
        wait_until(lambda: _query(base, 'sum(up{job=~"fleet-.*"})') == 2, timeout=60,
                   what="both targets up")
        wait_until(lambda: _query(base, "sum(fleet:generation_tokens_total)")
                   == len(result.token_ids), timeout=30, what="generation tokens in Prometheus")
        assert _query(base, "sum(fleet:time_to_first_token_seconds_count)") == 1
        assert _query(base, "fleet:queue_up") == 1
        assert _query(base, "sum(fleet:workers_alive)") == 1
        status, body = http_get(base + "/api/v1/rules")
        rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
        assert status == 200 and len(rules) == 11 and all(r["health"] != "err" for r in rules)
    finally:
        for proc in (prom, exporter):
            proc.terminate()
            proc.wait(15)


def test_every_alert_says_what_to_do_and_links_its_runbook_entry():
    import re

    import yaml

    runbook = (REPO / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    rules = [r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
             for r in g["rules"]]
    assert len(rules) == 11
    for rule in rules:
        link = rule["annotations"]["runbook"]
        assert link == f"docs/operations.md#{rule['alert'].lower()}", rule["alert"]
        assert link.split("#")[1] in anchors, rule["alert"]
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]
    (dead,) = [r for r in rules if r["alert"] == "FleetDeadLetters"]
    assert "rejected" not in dead["expr"] and dead["expr"].count("fleet:") == 1  # one expression
    assert dead["for"] == "5m"
