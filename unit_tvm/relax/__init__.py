"""Graph level: the passes unit_tvm.compile runs on a Relax model, one subpackage per job.

- core/          what the others share: graph queries and rewrites, the op chains a quantized
                 op fuses, the recipe each quantized op records, the smooth activations
- frontend/      repairs of what TVM's frontends produce (fixes.py runs them)
- quantization/  post-training quantization (ptq.quantize), calibration, QDQ models
- cpu/           the CPU kernels: tensorized int8 / bf16 ops, fused attention, default schedules
                 for the rest, the final build (build.build_relax)
- gpu/           the GPU path: fp16 / int8 Tensor Core kernels (pipeline.py)

docs/ARCHITECTURE.md lists the passes in the order they run.
"""

from .core.chains import find_chains
from .cpu.tensorize import UnitTensorize
from .quantization.ptq import quantize, recipes

__all__ = ["quantize", "UnitTensorize", "recipes", "find_chains"]
