"""The GPU path (pipeline.py): fp16 NHWC convolutions and dense layers on Tensor Cores, int8
with quantize, fused epilogues and operand loads, TVM's GPU schedules for the rest."""
