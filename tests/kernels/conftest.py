"""Kernel tests run the real kernels on a CUDA device and the Triton interpreter elsewhere.

TRITON_INTERPRET must be set before the first `triton.jit` runs (it is read when a kernel
module is imported), so it is set here, at conftest import, and only when no CUDA device is
present: on a GPU machine these same tests exercise the compiled kernels.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The repository root (for `import kernels`) and this folder (for kernel_cases) must be
# importable whatever pytest's import mode and working directory.
for _path in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
