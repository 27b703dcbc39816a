#!/usr/bin/env python3
"""End-to-end benchmark of zoo models against other engines. Same as `unit-tvm bench-model`."""
import sys

from unit_tvm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench-model", *sys.argv[1:]]))
