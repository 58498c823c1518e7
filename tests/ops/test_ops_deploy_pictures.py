"""The benchmark pictures say where they were measured: one per machine, the CPU, the date
and the spread of the runs in the title; the data file behind them agrees with each
machine's last recorded run; the latency benchmark's arithmetic (TTFT, inter-token gaps)."""
from __future__ import annotations

import json
import shutil

import pytest
from redis_server import REPO

from gpu_worker.bench import pictures
from gpu_worker.bench.latency_client import per_request

BENCH = REPO / "docs" / "bench"


def _runs() -> dict:
    return json.loads((BENCH / "throughput-runs.json").read_text())


def test_each_machine_has_its_own_picture_and_its_last_run_is_the_recorded_json():
    machines = _runs()["machines"]
    assert len({m["cpu"] for m in machines}) == len({m["png"] for m in machines}) == len(machines)
    for m in machines:
        last = json.loads((BENCH / m["json"]).read_text())
        for key, value in m["runs"][-1].items():
            assert round(last[key], 1) == value, (m["json"], key)
        assert (BENCH / m["png"]).exists()
    assert {m["png"] for m in machines} >= {p.name for p in BENCH.glob("throughput*.png")}


def test_titles_name_the_cpu_date_and_spread():
    line = pictures.machine_line("AMD EPYC X", "2026-11-30", 3)
    assert "AMD EPYC X" in line and "2026-11-30" in line and "median of 3 runs, whiskers min-max" in line
    assert "1 run (no spread)" in pictures.machine_line("c", "d", 1)
    assert "load avg 2.50" in pictures.machine_line("c", "d", 1, [2.5, 1.0, 1.0])
    assert pictures.spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    me = pictures.machine()
    assert me["cpu"] and me["date"].endswith("UTC") and len(me["load_avg"]) == 3


def test_the_pictures_redraw_from_the_data_file(tmp_path):
    pytest.importorskip("matplotlib")
    for name in ["throughput-runs.json"] + [m["json"] for m in _runs()["machines"]]:
        shutil.copy(BENCH / name, tmp_path / name)
    written = pictures.redraw_throughput(tmp_path)
    assert sorted(p.name for p in written) == sorted(m["png"] for m in _runs()["machines"])
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_ttft_and_inter_token_latency_from_token_arrivals():
    ttft, itl = per_request(10.0, [(10.5, 1), (10.6, 1), (10.9, 3)])
    assert ttft == pytest.approx(0.5)
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1])  # 3 tokens after 0.3 s: 0.1 s each
    ttft, itl = per_request(0.0, [(0.2, 2)])
    assert ttft == pytest.approx(0.2) and itl == [0.0]


def test_the_latency_report_and_picture(tmp_path):
    pytest.importorskip("matplotlib")
    from gpu_worker.bench import latency

    timed = [{"start": 0.0, "events": [[0.1, 1], [0.15, 1]]}, {"start": 1.0, "events": [[1.3, 1], [1.5, 2]]}]
    side = latency.summarize(timed)
    assert side["ttft_p50_ms"] == pytest.approx(100.0) and side["ttft_p99_ms"] == pytest.approx(300.0)
    assert sorted(side["itl_s"]) == pytest.approx([0.05, 0.1, 0.1])
    report = {"model": "m", "requests": 2, "interval_ms": 250.0, "threads": 2, "engine": side,
              "redis": side, "machine": pictures.machine(), "load_avg_before": [1.0, 1.0, 1.0],
              "load_avg_after": [2.0, 1.0, 1.0], "repeats": 2}
    assert latency.plot(report, tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
