"""Triton kernels for the GPU path, each beside a pure-torch reference (kernels/reference.py).

Names are imported lazily, so `kernels.quantize` and `kernels.reference` (pure torch) work
where triton is absent. A kernel module decides at import time whether it is interpreted:
set TRITON_INTERPRET=1 before the first kernel import to run kernels on CPU tensors (tests
only: it is slow). See kernels/README.md.
"""

import importlib

_EXPORTS = {
    "store_kvcache": "kernels.kv_cache",
    "paged_decode_attention": "kernels.decode_attention",
    "paged_prefill_attention": "kernels.prefill_attention",
    "fused_add_rmsnorm": "kernels.rms_norm",
    "rmsnorm": "kernels.rms_norm",
    "rotary_embedding": "kernels.rotary",
    "silu_and_mul": "kernels.activation",
    "int8_matmul": "kernels.quant_matmul",
    "int4_matmul": "kernels.quant_matmul",
    "quantize_int8": "kernels.quantize",
    "dequantize_int8": "kernels.quantize",
    "quantize_int4": "kernels.quantize",
    "dequantize_int4": "kernels.quantize",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
