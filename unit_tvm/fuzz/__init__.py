"""Differential fuzzer: random te/topi operations built by unit_tvm.build and by TVM's default
build, compared (exactly for integers, within a rounding bound for floats).

    from unit_tvm import fuzz
    report = fuzz.fuzz(cases=500, seed=0)      # a FuzzReport
    print(fuzz.table(report))

CLI: `unit-tvm fuzz --cases N --seed S [--kinds ...] [--json F]`; `--case I` reruns one case.
`--kinds model` fuzzes whole small models instead (model_cases.py, model_check.py: the graph
passes); `--kinds qdq` the same models quantized by ONNX Runtime into QDQ files (qdq_check.py);
`--kinds gpu_model` the same models through the GPU path in fp16 (gpu_check.py); `--kinds
attention` attention layers in drawn spellings and sizes through the fused kernels
(attention_case.py).
"""

import time

from .. import intrinsics
from .cases import (ATTENTION_KIND, GPU_MODEL_KIND, KINDS, MODEL_KIND, QDQ_KIND, SPEECH_KIND,
                    WHOLE_MODEL_KINDS, Case, make_case, make_op)
from .check import run_case
from .outcome import CLASSES, CaseResult
from .report import FAILURES, FuzzReport, result_line, table
from .worker import run_cases


def fuzz(cases=200, seed=0, kinds=KINDS, *, first=0, workers=1, timeout=300.0,
         on_result=None, emulate="") -> FuzzReport:
    """Run cases first .. first+cases-1 of `seed`, each in a worker process; a FuzzReport.
    emulate: an instruction this host lacks, checked as far as it can be here (see
    check.run_case)."""
    if emulate:
        intrinsics.get(emulate)  # KeyError naming the known ones
    unknown = sorted(set(kinds) - {*KINDS, *WHOLE_MODEL_KINDS})
    if unknown:
        raise ValueError(f"unknown fuzz kinds {unknown}; known: {', '.join(KINDS)}, "
                         f"{', '.join(WHOLE_MODEL_KINDS)}")
    whole = sorted(set(WHOLE_MODEL_KINDS) & set(kinds))
    if emulate and whole:
        raise ValueError(f"fuzz: emulate checks op-level cases only, not kind '{whole[0]}'")
    t0 = time.time()
    results = run_cases(seed, range(first, first + cases), tuple(kinds), workers=workers,
                        timeout=timeout, on_result=on_result, emulate=emulate)
    return FuzzReport(seed, tuple(sorted(results, key=lambda r: r.index)), time.time() - t0)


__all__ = ["fuzz", "FuzzReport", "Case", "CaseResult", "make_case", "make_op", "run_case",
           "run_cases", "table", "result_line", "KINDS", "MODEL_KIND", "QDQ_KIND",
           "GPU_MODEL_KIND", "SPEECH_KIND", "ATTENTION_KIND", "WHOLE_MODEL_KINDS", "CLASSES",
           "FAILURES"]
