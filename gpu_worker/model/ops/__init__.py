"""The model's compute ops: one interface (``base.ModelOps``) and three backends, chosen once
per model by ``backends.select_ops`` from ``EngineConfig.ops_backend`` and ``cpu_kernels``.

- ``cpu`` (``auto`` off CUDA; ``cpu_ops.py``): the C kernels of ``kernels/cpu``, loaded by
  ``cpu_native.py``, for the glue between matmuls and for attention; torch for the rest.
- ``torch`` (``torch_ops.py``): the CPU reference, and ``cpu``'s stand-in where the C kernels
  cannot be built or are switched off.
- ``triton`` (``auto`` on CUDA; ``triton_ops.py``); tests run it on the CPU under
  ``TRITON_INTERPRET=1``.

The matmuls are ``base.Linear`` modules that load-time swaps replace (``onednn.py``,
``model/quant``). This ``__init__`` imports nothing, so ``model/attention.py``, which the
backends use, can import ``cpu_native`` without running them first.
"""
