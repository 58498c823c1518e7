"""Writes ops/grafana/fleet-dashboard.json (run after changing a panel; a test checks the
committed file is what this writes, and that every metric it names exists).

    python ops/grafana/build_dashboard.py
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("fleet-dashboard.json")
M = 'model_name=~"$model"'


def _quantiles(metric: str) -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{M}}}[$__rate_interval])))",
             f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99)]


# (row, [(title, unit, [(expr, legend)])])
ROWS = [
    ("Queue (fleet exporter)", [
        ("Backlog: lag + pending", "short", [(f"sum(fleet:queue_backlog{{{M}}})", "backlog")]),
        ("Lag by lane", "short", [(f"fleet:stream_lag{{{M}}}", "{{lane}}")]),
        ("Pending by lane", "short", [(f"fleet:stream_pending{{{M}}}", "{{lane}}")]),
        ("Stream length by lane", "short", [(f"fleet:stream_length{{{M}}}", "{{lane}}")]),
        ("Consumers by lane", "short", [(f"fleet:stream_consumers{{{M}}}", "{{lane}}")]),
        ("Workers alive / draining", "short", [(f"fleet:workers_alive{{{M}}}", "alive"),
                                               (f"fleet:workers_draining{{{M}}}", "draining")]),
        ("Dead letters (page: FleetDeadLetters)", "short", [
            (f"fleet:dead_letters{{{M}}}", "in stream"),
            (f"sum by (reason) (increase(fleet:requests_dead_lettered_total{{{M}}}[$__rate_interval]))",
             "new: {{reason}}")]),
        ("Rejected / s by code (client errors, never page)", "reqps", [
            (f"sum by (code) (rate(fleet:requests_rejected_total{{{M}}}[$__rate_interval]))",
             "{{code}}")]),
        ("Exporter", "short", [("fleet:queue_up", "Redis up"),
                               ("fleet:exporter_scrape_seconds", "scrape seconds")]),
    ]),
    ("Load (workers)", [
        ("Requests running / waiting", "short", [
            (f"sum by (instance) (fleet:num_requests_running{{{M}}})", "running {{instance}}"),
            (f"sum by (instance) (fleet:num_requests_waiting{{{M}}})", "waiting {{instance}}")]),
        ("KV-cache usage", "percentunit", [(f"fleet:kv_cache_usage_perc{{{M}}}", "{{instance}}")]),
        ("Free KV blocks", "short", [(f"fleet:num_free_blocks{{{M}}}", "{{instance}}")]),
        ("Prefix-cache hit rate", "percentunit", [
            (f"sum(rate(fleet:prefix_cache_hits_total{{{M}}}[$__rate_interval])) / "
             f"sum(rate(fleet:prefix_cache_queries_total{{{M}}}[$__rate_interval]))", "hit rate")]),
        ("Preemptions / s", "short", [
            (f"sum(rate(fleet:num_preemptions_total{{{M}}}[$__rate_interval]))", "preemptions")]),
        ("Redis errors / s by class; writes refused", "short", [
            (f"sum by (kind) (rate(fleet:redis_errors_total{{{M}}}[$__rate_interval]))", "{{kind}}"),
            (f"max(fleet:redis_refusing_writes{{{M}}})", "refusing writes (OOM)")]),
    ]),
    ("Throughput", [
        ("Tokens / s", "short", [
            (f"sum(rate(fleet:prompt_tokens_total{{{M}}}[$__rate_interval]))", "prompt"),
            (f"sum(rate(fleet:generation_tokens_total{{{M}}}[$__rate_interval]))", "generation")]),
        ("Tokens / s by tenant", "short", [
            (f"sum by (tenant) (rate(fleet:tenant_generation_tokens_total{{{M}}}[$__rate_interval]))",
             "{{tenant}}")]),
        ("Requests held by tenant", "short", [
            (f"sum by (tenant) (fleet:tenant_requests_held{{{M}}})", "{{tenant}}")]),
        ("Finished / s by reason", "reqps", [
            (f"sum by (finished_reason) (rate(fleet:request_success_total{{{M}}}[$__rate_interval]))",
             "{{finished_reason}}"),
            (f"sum by (code) (rate(fleet:request_failure_total{{{M}}}[$__rate_interval]))",
             "failed: {{code}}")]),
        ("Cancelled, reclaimed / s", "reqps", [
            (f"sum(rate(fleet:requests_cancelled_total{{{M}}}[$__rate_interval]))", "cancelled"),
            (f"sum(rate(fleet:leases_reclaimed_total{{{M}}}[$__rate_interval]))", "reclaimed")]),
        ("Speculative acceptance", "percentunit", [
            (f"sum by (proposer) (rate(fleet:spec_decode_num_accepted_tokens_total{{{M}}}[$__rate_interval])) / "
             f"sum by (proposer) (rate(fleet:spec_decode_num_draft_tokens_total{{{M}}}[$__rate_interval]))",
             "{{proposer}}")]),
    ]),
    ("Gateway", [
        ("Gateway requests / s by route and status", "reqps", [
            ("sum by (route, status) (rate(fleet:gateway_requests_total[$__rate_interval]))",
             "{{route}} {{status}}")]),
        ("Gateway latency p99 by route", "s", [
            ("histogram_quantile(0.99, sum by (route, le) "
             "(rate(fleet:gateway_request_duration_seconds_bucket[$__rate_interval])))", "{{route}}")]),
        ("Gateway requests in flight", "short", [
            ("sum by (route) (fleet:gateway_requests_in_flight)", "{{route}}")]),
    ]),
    ("Latency", [
        ("Time to first token", "s", _quantiles("fleet:time_to_first_token_seconds")),
        ("Inter-token latency", "s", _quantiles("fleet:inter_token_latency_seconds")),
        ("End-to-end latency", "s", _quantiles("fleet:e2e_request_latency_seconds")),
        ("Queue time (enqueue to admission)", "s", _quantiles("fleet:request_queue_time_seconds")),
        ("Engine step time", "s", _quantiles("fleet:engine_step_seconds")),
    ]),
]


def _panel(panel_id: int, title: str, unit: str, targets, x: int, y: int) -> dict:
    return {
        "id": panel_id, "type": "timeseries", "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(targets)],
    }


def build() -> dict:
    panels, panel_id, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": panel_id, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        panel_id, y = panel_id + 1, y + 1
        for i, (title, unit, targets) in enumerate(row_panels):
            panels.append(_panel(panel_id, title, unit, targets, (i % 3) * 8, y + (i // 3) * 8))
            panel_id += 1
        y += ((len(row_panels) + 2) // 3) * 8
    templating = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
        {"name": "model", "type": "query", "label": "Model", "includeAll": True, "multi": True,
         "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
         "query": {"query": "label_values(fleet:queue_backlog, model_name)", "refId": "model"},
         "definition": "label_values(fleet:queue_backlog, model_name)"},
    ]
    return {"title": "LLM fleet", "uid": "redis-llm-fleet", "schemaVersion": 39, "version": 1,
            "editable": True, "tags": ["llm", "redis", "fleet"], "time": {"from": "now-3h", "to": "now"},
            "refresh": "30s", "timezone": "", "templating": {"list": templating},
            "annotations": {"list": []}, "panels": panels}


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
