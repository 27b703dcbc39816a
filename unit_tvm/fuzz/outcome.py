"""What one fuzz case ended in, shared by the op-level check (check.py) and the per-kind checks
of whole models (model_check.py, qdq_check.py, gpu_check.py, attention_case.py)."""

import contextlib
import time
import warnings
from dataclasses import dataclass

CLASSES = ("tensorized-correct", "fallback-correct", "wrong", "crash", "hard-crash", "timeout",
           "invalid")


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one case."""

    index: int
    kind: str
    description: str
    outcome: str  # one of CLASSES
    intrinsic: str = ""
    mapping: str = ""
    stages: tuple = ()
    detail: str = ""  # the error, the mismatch or the fallback reason (first line)
    seconds: float = 0.0
    reproduce: str = ""


def failed(base: dict, outcome: str, error: Exception, t0: float) -> CaseResult:
    """The CaseResult of a case that ended in `error`, classified `outcome` ("invalid": PyTorch,
    TVM or ONNX Runtime alone failed; "crash": unit-tvm did)."""
    return CaseResult(**base, outcome=outcome, detail=first_line(error),
                      seconds=time.time() - t0)


@contextlib.contextmanager
def quiet():
    """Python's warnings off: TVM and PyTorch warn many times per model case."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def first_line(e):
    """One line naming an exception: its type and the line of its message that says what failed."""
    text = str(e).strip().splitlines()
    # TVM's C++ errors put the check that failed on the last line of a long traceback
    line = next((ln for ln in reversed(text) if "Check failed" in ln or "Error" in ln), None)
    return f"{type(e).__name__}: {(line or (text[0] if text else '')).strip()[:300]}"
