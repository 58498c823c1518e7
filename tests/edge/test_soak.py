"""``fleet bench soak``, short: three real workers under kill -9, SIGSTOP/SIGCONT and a
Redis restart, with valid and hostile traffic; the report's invariants must all hold."""
from __future__ import annotations

import json
import subprocess
import sys

from redis_server import REPO, subprocess_env

from gpu_worker.bench.soak_faults import FAULT_KINDS, fault_schedule

SEED, MINUTES, INTERVAL_S = 2, 0.75, 5.0


def test_the_schedule_is_seeded_bounded_and_leaves_a_quiet_end():
    schedule = fault_schedule(SEED, MINUTES * 60, INTERVAL_S)
    assert schedule == fault_schedule(SEED, MINUTES * 60, INTERVAL_S)
    assert {kind for _, kind in schedule} == set(FAULT_KINDS)
    assert all(at < MINUTES * 60 - INTERVAL_S for at, _ in schedule)
    assert len(schedule) <= MINUTES * 60 / (0.7 * INTERVAL_S)


def test_short_soak_loses_repeats_and_reorders_nothing(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "gpu_worker.cli", "bench", "soak", "--minutes", str(MINUTES),
           "--seed", str(SEED), "--workers", "3", "--fault-interval-s", str(INTERVAL_S),
           "--invalid-share", "0.15", "--request-timeout-s", "40", "--settle-s", "20",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert out.exists(), proc.stdout + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    broken = [name for name, ok in report["invariants"].items() if not ok]
    details = json.dumps({k: report[k] for k in ("valid", "invalid", "faults", "end",
                                                 "worker_exits_unexplained")}, indent=1)
    assert not broken, f"broken: {broken}\n{details[:8000]}"
    assert proc.returncode == 0
    assert report["valid"]["answered"] > 50 and report["invalid"]["with_readable_id"] > 0
    assert report["faults_by_kind"].get("restart_redis", 0) >= 1
    assert sum(report["faults_by_kind"].values()) >= 4
    tokens = report["tokens"]
    assert tokens["lost"] == tokens["repeated"] == tokens["out_of_order"] == 0
    assert report["max_recovery_s"] is not None and report["max_recovery_s"] < 30
