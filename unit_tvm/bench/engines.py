"""The engines a model benchmark compares, as one typed interface.

An Engine is what it takes to run a model once (`call`, on the benchmark input), to get its
outputs on other inputs (`infer`, for accuracy), and what it reports about itself: the thread
count read back from the engine (not the one asked for) and which variant was used.
"""

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class ModelCase:
    """One model and its data, shared by every engine of a run."""

    name: str
    model: object  # torch.nn.Module with fixed-seed weights, eval mode; None for an ONNX file
    shape: tuple
    calibration: list  # numpy inputs for post-training quantization
    inputs: list  # numpy inputs for accuracy (inputs[0] is the timed one)
    threads: int
    options: dict = field(default_factory=dict)  # database, tune, trials, target
    onnx_path: str | None = None  # the model as the user's ONNX file (engines start from it)
    # the file arrives quantized (QDQ pairs): every engine runs the file's own quantization,
    # and the accuracy reference is ONNX Runtime running the file
    quantized: bool = False

    @property
    def transformer(self) -> bool:
        """Whether the model is a transformer (BERT, ViT, the speech encoders): the engines'
        quantizers have presets for those. A torch model is one when it has attention layers
        (torch's own, or the zoo's EncoderLayer); an ONNX file when its input is a sequence of
        vectors (rank 3)."""
        if self.model is None:
            return len(self.shape) == 3
        return any(type(m).__name__ in ("MultiheadAttention", "EncoderLayer")
                   for m in self.model.modules())


@dataclass
class Engine:
    """A compiled model of one engine, ready to time."""

    name: str
    precision: str  # "int8", "bf16" or "fp32"
    call: Callable[[], object]  # one inference on case.inputs[0]
    infer: Callable[[np.ndarray], np.ndarray]  # first output for an input, as numpy
    threads: str  # what the engine reports it uses
    compile_s: float
    variant: str = ""  # which configuration (ORT format, PT2E mode...)
    extra: dict = field(default_factory=dict)  # engine-specific facts for the JSON


# How each engine keeps to an ISA level the run is held to (`unit-tvm --isa`, UNIT_TVM_ISA),
# by the start of its name. Checked on Zen 4 held to AVX2: OpenVINO's convs ran as
# brgconv_avx2 primitives, PyTorch FX's quantized convs as oneDNN jit_uni_int8:avx2.
_ISA_OBEDIENCE = (
    ("unit-tvm", "held (its LLVM target)"),
    ("TVM", "held (its LLVM target)"),
    # measured on Zen 5 (GenAI 2026.4.1): under ONEDNN_MAX_CPU_ISA=AVX2, AVX512_CORE or
    # AVX512_CORE_VNNI its int8-weight matmuls (FullyConnectedCompressed) find no primitive
    ("OpenVINO GenAI", "cannot be held (its int8-weight matmuls find no primitive below the "
                       "CPU's ISA): left out"),
    # measured on Zen 5 (OpenVINO 2026.4.1, 2 threads): under ONEDNN_MAX_CPU_ISA=AVX2 a float32
    # 3x3 conv ran at 255 GFLOPS (native 499), the AVX2 multiply-add's peak, but a 128 x 768 x
    # 3072 float32 MatMul at 464 (native 447), past that peak: its float32 matmuls ignore the cap
    ("OpenVINO fp32", "partly: convs held (ONEDNN_MAX_CPU_ISA), float32 MatMul / "
                      "FullyConnected run this CPU's ISA"),
    ("OpenVINO", "held (ONEDNN_MAX_CPU_ISA)"),
    ("llama.cpp", "held (built again for the level: bench/llama_isa.py)"),
    ("PyTorch PT2E", "held (oneDNN: ONEDNN_MAX_CPU_ISA; ATen: ATEN_CPU_CAPABILITY)"),
    ("PyTorch int8", "partly: convs held (oneDNN), linear layers run FBGEMM on this CPU's ISA"),
    ("PyTorch", "held (oneDNN: ONEDNN_MAX_CPU_ISA; ATen: ATEN_CPU_CAPABILITY)"),
    ("ORT", "NOT held: ONNX Runtime picks its kernels from this CPU's own ISA"),
)


def isa_obedience(engine: str, level: str) -> str:
    """Whether `engine` runs at the ISA level this run is held to ("" at the native level)."""
    if level == "native":
        return ""
    return next((note for prefix, note in _ISA_OBEDIENCE if engine.startswith(prefix)),
                "unknown")


def first_output(out):
    """The first output of an engine's call as a numpy array."""
    while isinstance(out, (list, tuple)) or (hasattr(out, "__getitem__") and
                                             not hasattr(out, "shape") and
                                             not hasattr(out, "numpy")):
        out = out[0]
    if hasattr(out, "numpy"):
        out = out.numpy()
    return np.asarray(out)


class Stopwatch:
    """Seconds since creation (compile times)."""

    def __init__(self):
        self.t0 = time.time()

    def __call__(self):
        return time.time() - self.t0


def cosine(a, b) -> float:
    """Cosine similarity of two arrays, flattened."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def accuracy(outs, refs):
    """(mean cosine similarity, top-1 agreement). Top-1 is the argmax over the last axis, per
    row: per image for classifiers, per token for an encoder's [1, seq, hidden] output."""
    cos, top1 = [], []
    for o, r in zip(outs, refs):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        cos.append(cosine(o, r))
        rows_o, rows_r = o.reshape(-1, o.shape[-1]), r.reshape(-1, r.shape[-1])
        top1.append(float(np.mean(rows_o.argmax(-1) == rows_r.argmax(-1))))
    return float(np.mean(cos)), float(np.mean(top1))


def fastest_accurate(times, cosines, min_cosine=0.99):
    """The variant with the lowest minimum time among those within min_cosine of fp32 (the most
    accurate one when none is)."""
    accurate = [n for n in times if cosines[n] >= min_cosine] or [max(cosines, key=cosines.get)]
    return min(accurate, key=lambda n: times[n].min_ms)
