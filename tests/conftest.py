"""Suite-wide setup. Triton kernels run under the interpreter when there is no GPU; the
flag must be set before any kernel module is imported, whichever test file comes first."""
import os


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
