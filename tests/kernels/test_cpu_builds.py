"""The C kernels compile for each instruction set they serve (kernels/cpu/simd.h): AVX-512,
AVX2 with FMA, and neither (the portable loops), whatever this machine has. The engine builds
them with -march=native, so a change that breaks another build would otherwise only show on
another kind of machine, where the build fails and the engine falls back to its torch path."""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

import kernels.cpu as cpu_kernels

HERE = Path(cpu_kernels.__file__).parent
TARGETS = {"avx512": "-march=skylake-avx512", "avx2": "-march=x86-64-v3", "portable": "-march=x86-64-v2"}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 instruction sets")
@pytest.mark.parametrize("isa", sorted(TARGETS))
def test_the_cpu_kernels_build_for(isa, tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    flags = [f for f in cpu_kernels.FLAGS if f != "-march=native"] + [TARGETS[isa]]
    proc = subprocess.run([cc, *flags, *(str(HERE / s) for s in cpu_kernels.SOURCES), "-o",
                           str(tmp_path / "lib.so"), "-lm"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
