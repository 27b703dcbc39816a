#!/usr/bin/env python3
"""GPU op benchmark: UNIT Table I convs on Tensor Cores vs cuDNN. Same as `unit-tvm bench-gpu`."""
import sys

from unit_tvm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-gpu", *sys.argv[1:]]))
