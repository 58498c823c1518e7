"""Compile every kernel variant the launchers produce, for a GPU target, on any machine.

    python ops/bench/compile_check.py [--arch 90] [--quick]

The interpreter (TRITON_INTERPRET=1) runs kernels as numpy code and accepts things the real
compiler rejects (non-constexpr globals, dtype mismatches in loop-carried values, dot shape
limits). This script calls each launcher on CPU tensors with its kernels swapped for
recorders, then compiles each recorded (signature, constexprs) variant to a cubin with the
ptxas that ships in the triton wheel. No GPU needed; nothing is launched. Exit status 1 if
any variant fails to compile. Note the compiler is this machine's triton, which may be newer
than the GPU machine's.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # kernels must be JITFunctions, not interpreted
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import kernels  # noqa: E402
from kernels import (  # noqa: E402
    activation, decode_attention, kv_cache, prefill_attention, quant_matmul, rms_norm, rotary,
)

POINTER_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int8: "*i8",
                 torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64"}
KERNEL_MODULES = (activation, decode_attention, kv_cache, prefill_attention, quant_matmul, rms_norm, rotary)


class Recorder:
    """Stands in for a JITFunction: `kernel[grid](*args, **kwargs)` records the variant."""

    def __init__(self, fn):
        self.fn, self.variants = fn, {}

    def __getitem__(self, grid):
        return self.record

    def record(self, *args, **kwargs):
        bound = {**dict(zip(self.fn.arg_names, args)), **kwargs}
        signature, constexprs = {}, {}
        for param in self.fn.params:
            value = bound[param.name]
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                # The GPU path never upcasts bfloat16 dots (only CPU tensors do).
                constexprs[param.name] = False if param.name == "UPCAST" else value
            elif isinstance(value, torch.Tensor):
                signature[param.name] = POINTER_TYPES[value.dtype]
            elif isinstance(value, float):
                signature[param.name] = "fp32"
            else:
                signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        self.variants[repr((sorted(signature.items()), sorted(constexprs.items())))] = (signature, constexprs)


def install_recorders() -> list[Recorder]:
    recorders = []
    for module in KERNEL_MODULES:
        for name, value in list(vars(module).items()):
            if isinstance(value, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                recorder = Recorder(value)
                setattr(module, name, recorder)
                recorders.append(recorder)
    return recorders


def paged_inputs(num_seqs, heads, kv_heads, dim, dtype, context=40, block_size=16):
    blocks = num_seqs * -(-context // block_size)
    cache = torch.zeros(blocks, block_size, kv_heads, dim, dtype=dtype)
    tables = torch.zeros(num_seqs, blocks // num_seqs, dtype=torch.int32)
    return cache, cache.clone(), tables, torch.full((num_seqs,), context, dtype=torch.int32)


def exercise(dtypes, head_configs, quick: bool) -> None:
    """Call every launcher the way the tests and the model do."""
    for dtype in dtypes:
        for heads, kv_heads, dim in head_configs:
            k_cache, v_cache, tables, lens = paged_inputs(3, heads, kv_heads, dim, dtype)
            q = torch.zeros(3, heads, dim, dtype=dtype)
            for splits in ((None,) if quick else (None, 1, 3)):
                kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, num_splits=splits)
            cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
            kernels.paged_prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.1, 1)
            kv = torch.zeros(3, kv_heads, dim, dtype=dtype)
            kernels.store_kvcache(kv, kv, k_cache, v_cache, torch.zeros(3, dtype=torch.int64))
            kernels.rotary_embedding(q, kv, torch.zeros(3, dtype=torch.int64), torch.zeros(8, dim))
        for hidden in (100, 4096):
            x = torch.zeros(2, hidden, dtype=dtype)
            kernels.fused_add_rmsnorm(x, x, torch.zeros(hidden, dtype=dtype), 1e-6)
            kernels.rmsnorm(x, torch.zeros(hidden, dtype=dtype), 1e-6)
            kernels.silu_and_mul(x)
        for m in (1, 64):
            x = torch.zeros(m, 256, dtype=dtype)
            kernels.int8_matmul(x, torch.zeros(48, 256, dtype=torch.int8), torch.zeros(48))
            for group in (32, 128):
                groups = torch.zeros(48, 256 // group)
                kernels.int4_matmul(x, torch.zeros(48, 128, dtype=torch.uint8), groups, groups.clone(), group)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100/H200")
    parser.add_argument("--quick", action="store_true", help="bf16, the Llama-3-8B and one odd head shape")
    args = parser.parse_args(argv)
    recorders = install_recorders()
    if args.quick:
        exercise([torch.bfloat16], [(32, 8, 128), (9, 3, 16)], quick=True)
    else:
        configs = [(32, 8, 128), (3, 3, 32), (9, 3, 16), (6, 3, 64), (4, 2, 8)]
        exercise([torch.float32, torch.float16, torch.bfloat16], configs, quick=False)
    target = GPUTarget("cuda", args.arch, 32)
    failures, count, started = [], 0, time.perf_counter()
    for recorder in recorders:
        for signature, constexprs in recorder.variants.values():
            count += 1
            try:
                triton.compile(ASTSource(recorder.fn, signature, constexprs), target=target)
            except Exception as exc:  # report every failing variant, not just the first
                failures.append(f"{recorder.fn.__name__} {constexprs}: {type(exc).__name__}: {exc}")
    for failure in failures:
        print("FAILED", failure[:2000])
    print(f"compiled {count - len(failures)}/{count} kernel variants for sm_{args.arch} "
          f"in {time.perf_counter() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
