"""Static checks that catch what a CPU-only suite cannot run: an undefined name on the CUDA
path (the engine's graph capture once referenced a function it never imported) fails here
before it fails on a GPU machine."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyflakes_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    proc = subprocess.run([ruff, "check", "--select", "F,E9", "--output-format", "concise", "--no-cache",
                           "producer", "gpu_worker", "shared", "kernels", "ops", "tests"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
