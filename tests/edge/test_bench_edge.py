"""``fleet bench edge`` end to end with tiny numbers: the real worker (synthetic engine),
a real single server and a real 3-master cluster started by the bench, real clients.
Correctness only (every token once, in order, the right result), never speed."""
from __future__ import annotations

import json
import subprocess
import sys

from redis_server import REPO, subprocess_env


def test_bench_edge_runs_and_every_client_sees_every_token_once(tmp_path):
    out = tmp_path / "edge.json"
    cmd = [sys.executable, "-m", "gpu_worker.cli", "bench", "edge", "--seconds", "1",
           "--warmup-s", "0.3", "--seqs", "8", "--step-ms", "10", "--max-tokens", "24",
           "--intervals", "30", "--idle-s", "0.3", "--script-rounds", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert {(r["topology"], r["variant"], r["stream_interval_ms"]) for r in runs} == {
        (t, v, i) for t in ("single", "cluster") for v, i in (("baseline", 0), ("cut", 30))}
    for r in runs:
        assert r["correct"] and r["tokens"] > 0 and r["requests_done"] > 0, r
        assert r["repeated"] == r["gaps"] == r["differing"] == r["bad_results"] == 0
        assert r["redis_cpu_s_per_1k_tokens"] > 0
    coalesced = [r for r in runs if r["stream_interval_ms"] == 30]
    assert all(r["events_per_token"] < 1 for r in coalesced)  # steps of 10 ms, events >= 30 ms
    assert set(report["summary"]["steady"]) == {"single", "cluster", "cluster_over_single"}
    for topology in ("single", "cluster"):  # the cut script alone, beside the old one
        assert report["publish_script_server_us_per_call"][topology]["cut"] > 0
