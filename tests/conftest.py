"""Suite-wide setup. Triton kernels run under the interpreter when there is no GPU; the
flag must be set before any kernel module is imported, whichever test file comes first."""
import os

# The suite runs redis-server, worker processes and the test runner on the same (2) cores:
# OpenMP threads that spin at barriers would steal their time (a tiny-model workload took
# 7.0 s instead of 0.47 s). Sleeping waiters, for this process and every worker it starts.
# Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
