"""Package-level promises of kernels/: every exported name is the function (not a
submodule of the same name), and the torch-only parts import where triton is absent."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_exports_are_functions_even_after_submodule_imports():
    pytest.importorskip("triton")
    import kernels
    import kernels.rms_norm  # noqa: F401 - importing a submodule must not shadow an export

    for name in kernels.__all__:
        assert callable(getattr(kernels, name)), name
        assert getattr(kernels, name).__name__ == name


def test_quantize_and_reference_import_without_triton():
    code = "import sys; sys.modules['triton'] = None; import kernels.quantize, kernels.reference; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
