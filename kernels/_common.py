"""Helpers shared by the kernel launchers: argument checks and the one `tl.dot` wrapper.

Every launcher validates its arguments with `require` (ValueError on misuse) before it
launches anything; device data (slot ids, block ids, lengths) is never read on the host,
so the launchers stay free of synchronisation and can be captured in CUDA graphs.
"""

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds (misuse, not an internal bug)."""
    if not condition:
        raise ValueError(message)


def require_tensor(name: str, t: torch.Tensor, ndim: int, dtypes: tuple) -> None:
    """Check rank and dtype, and that the last dimension is unit-stride (kernels index it densely)."""
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor")
    require(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    require(t.dtype in dtypes, f"{name} dtype {t.dtype} not in {dtypes}")
    require(t.numel() == 0 or t.stride(-1) == 1, f"{name} must be contiguous in its last dim")


def require_same_device(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor")
    devices = {name: t.device for name, t in tensors.items()}
    require(len(set(devices.values())) == 1, f"tensors on different devices: {devices}")


def dot_flags(dtype: torch.dtype, device: torch.device) -> dict:
    """Constexpr arguments for `mma`.

    float32 uses exact "ieee" products: tf32 would cost about three decimal digits and the
    float32 path exists for accuracy, not speed. bfloat16 on a CPU tensor (only possible under
    TRITON_INTERPRET=1) is upcast to float32 before the dot, because the interpreter
    multiplies the raw bfloat16 bit patterns (triton-lang/triton#11584); on a GPU the native
    bfloat16 dot runs.
    """
    return {
        "UPCAST": dtype == torch.bfloat16 and device.type == "cpu",
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


def next_pow2(n: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(1, n)))


@triton.jit
def mma(a, b, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b with a float32 result; see `dot_flags` for the two switches."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


def require_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, dtype: torch.dtype, head_dim: int) -> None:
    """k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, one
    shape, and of the dtype of the tensors they are used with."""
    require_tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    require(isinstance(v_cache, torch.Tensor) and v_cache.shape == k_cache.shape, "k_cache and v_cache shapes differ")
    require(k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous")
    require(k_cache.dtype == v_cache.dtype == dtype, f"cache dtypes {k_cache.dtype}/{v_cache.dtype} != {dtype}")
    require(k_cache.shape[3] == head_dim, f"cache head_dim {k_cache.shape[3]} != head_dim {head_dim}")
