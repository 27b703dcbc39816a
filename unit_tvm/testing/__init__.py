"""What the tests, benchmarks and figures run on: the model zoo (fixed-seed torch models), the
op workloads (UNIT Table I, GEMMs, ResNet-18-3D) and numpy references for packed layouts. The
compiler does not import it."""
