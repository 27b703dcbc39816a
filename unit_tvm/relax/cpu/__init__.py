"""The CPU kernels of a model: UnitTensorize (tensorize.py) puts tensorized int8 / bf16 kernels
in place of the quantized ops, fused attention, default schedules for the operators no
instruction covers, and the final build (build.build_relax)."""
