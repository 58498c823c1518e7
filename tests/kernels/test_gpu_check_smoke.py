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
