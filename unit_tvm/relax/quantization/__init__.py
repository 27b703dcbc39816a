"""Post-training quantization of a Relax model (ptq.quantize): calibration on this CPU, weight
scales (per channel, pair-bounded for the pre-VNNI pair form), QDQ models' own scales, which
edges carry uint8, and the re-emitted main with one quantized op per chain."""
