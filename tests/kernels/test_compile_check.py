"""The kernels compile for a real GPU target (sm_90), not only run in the interpreter, which
accepts code the compiler rejects. Runs ops/bench/compile_check.py --quick in a fresh
process (kernel modules must be imported without TRITON_INTERPRET); needs no GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90():
    if not (Path(triton.__file__).parent / "backends" / "nvidia").is_dir():
        pytest.skip("this triton build has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, str(ROOT / "ops/bench/compile_check.py"), "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "FAILED" not in proc.stdout
