"""The GPU check script's --dry-run mode runs end to end (tiny shapes; the interpreter on a
CPU), so the script a later GPU session relies on is not dead code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_writes_sane_json(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ops/bench/gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["dry_run"] and result["peak_copy_GBps"] > 0
    kinds = {row["kind"] for row in result["micro"]}
    assert kinds == {"decode", "prefill", "matmul"}
    for row in result["micro"]:
        if "max_abs_diff_vs_sdpa" in row:  # the paged kernels agree with SDPA on the same K/V
            assert row["max_abs_diff_vs_sdpa"] < 3e-2, row  # bf16 on a GPU
        if row["kind"] == "matmul":
            assert row["int8_rel_err_vs_dense"] < 0.02 and row["int4_rel_err_vs_dense"] < 0.2, row
    assert [row["batch"] for row in result["decode"]] == [1, 3]
    assert all(row["logits_finite"] and row["eager_tokens_per_s"] > 0 for row in result["decode"])


def test_quant_matmul_sweep_dry_run_checks_every_config(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ops/bench/quant_matmul_sweep.py"), "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "quant_matmul_sweep.json").read_text())["results"]
    configs = [r for r in rows if "kind" in r]
    assert {(r["kind"], r["splits"]) for r in configs} == {("int8", 1), ("int8", 2), ("int4", 1), ("int4", 2)}
    assert all(r["err"] < 1e-5 for r in configs), configs   # float32 under the interpreter
    summary = [r for r in rows if "kind" not in r]
    assert summary and all(r["int8_best"] and r["int4_best"] for r in summary)
