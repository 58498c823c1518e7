"""Weight-only INT8 / INT4 quantization, done once at load: ``quantize.py`` swaps the model's
``Linear`` projections for quantized ones; INT4 is calibrated on built-in and self-generated
text (``calibration.py``, ``gptq.py``, ``int4_fit.py``) and cached per model (``cache.py``,
filled ahead of time by ``fleet quantize``, ``cli.py``). Like ``model/ops``, this ``__init__``
imports nothing: import the module you need."""
