"""Worker jobs for the fuzzer's own tests: module-level so a spawned worker can import them."""

import ctypes
import time

from unit_tvm.fuzz.worker import run_one


def segfault_on_case_1(seed, index, kinds, emulate=""):
    """Dereference NULL on case 1 (what a crash inside TVM's C++ does); run the others."""
    if index == 1:
        ctypes.string_at(0)
    return run_one(seed, index, kinds, emulate)


def hang_on_case_0(seed, index, kinds, emulate=""):
    """Never finish case 0; run the others."""
    if index == 0:
        time.sleep(3600)
    return run_one(seed, index, kinds, emulate)
