"""Run an exported Relax model on numpy inputs: the aarch64 side of unit_tvm.cross.arm_python.

Executed by the aarch64 Python under qemu, with only TVM's runtime wheels on its path (not
unit-tvm), as: python arm_vm_main.py MODEL.so INPUTS.npz OUTPUTS.npz
Inputs are the .npz's arrays in name order (arr_0, arr_1, ...); outputs are written the same way.
A fourth argument, CALLS (default 1), calls main that many times; 0 only loads the model and the
inputs (the baseline an instruction count subtracts).
"""

import sys


def main(library: str, inputs: str, outputs: str, calls: str = "1") -> None:
    """Load `library` into TVM's runtime VM, call main on the inputs, save what it returns."""
    import numpy as np
    import tvm
    from tvm.runtime.vm import VirtualMachine

    vm = VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
    data = np.load(inputs)
    names = sorted(data.files, key=lambda n: int(n.split("_")[-1]))
    args = [tvm.runtime.tensor(data[n]) for n in names]
    if int(calls) == 0:
        return
    for _ in range(int(calls)):
        result = vm["main"](*args)
    results = [result] if hasattr(result, "numpy") else list(result)
    np.savez(outputs, *[r.numpy() for r in results])


if __name__ == "__main__":
    main(*sys.argv[1:5])
