#!/usr/bin/env python3
"""Op benchmark: UNIT Table I convs and GEMMs vs TVM and PyTorch int8 (`unit-tvm bench-op`)."""
import sys

from unit_tvm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-op", *sys.argv[1:]]))
