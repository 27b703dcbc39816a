"""PyTorch engines: the fp32 module as it is (eager: what a user starts from), FX graph-mode
int8 (x86 backend: oneDNN/fbgemm), PT2E int8 through torchao's X86InductorQuantizer compiled
by inductor (freezing on, as its docs advise for int8), and the bf16 module (channels_last for
images)."""

import copy

import numpy as np

from .engines import Engine, ModelCase, Stopwatch, cosine, fastest_accurate, first_output
from ..timing import interleaved


def _engine(name, precision, fn, case, watch, variant="", extra=None):
    import torch

    x = torch.tensor(case.inputs[0])

    def call():
        with torch.inference_mode():
            return fn(x)

    def infer(inp):
        with torch.inference_mode():
            return first_output(fn(torch.tensor(inp)).float())

    return Engine(name, precision, call, infer, threads=str(torch.get_num_threads()),
                  compile_s=watch(), variant=variant, extra=extra or {})


def torch_fp32(case: ModelCase) -> Engine:
    """The fp32 module, eager (oneDNN / MKL kernels): what the model costs before any engine."""
    import torch

    watch = Stopwatch()
    torch.set_num_threads(case.threads)
    return _engine("PyTorch fp32", "fp32", case.model, case, watch, "eager")


def torch_inductor_fp32(case: ModelCase) -> Engine:
    """The fp32 module through torch.compile (inductor, freezing on), with and without
    max-autotune: the faster of the two (both are fp32: their outputs are not compared)."""
    import torch
    import torch._inductor.config as inductor_config

    watch = Stopwatch()
    torch.set_num_threads(case.threads)
    inductor_config.freezing = True
    x = torch.tensor(case.inputs[0])
    built = {}
    for mode in ("default", "max-autotune"):
        torch._dynamo.reset()
        fn = torch.compile(copy.deepcopy(case.model), mode=mode)
        _no_grad(fn, x)  # compiles
        built[mode] = fn
    times = interleaved({m: (lambda f=f: _no_grad(f, x)) for m, f in built.items()},
                        rounds=6, warmup=2)
    best = min(times, key=lambda m: times[m].min_ms)
    return _engine("PyTorch inductor fp32", "fp32", built[best], case, watch, f"inductor, {best}",
                   {"variants": {m: {"min_ms": t.min_ms} for m, t in times.items()}})


def torch_fx_int8(case: ModelCase) -> Engine:
    """FX post-training quantization with the x86 backend's default qconfig."""
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    watch = Stopwatch()
    torch.set_num_threads(case.threads)
    torch.backends.quantized.engine = "x86"
    example = (torch.tensor(case.calibration[0]),)
    prepared = prepare_fx(copy.deepcopy(case.model), get_default_qconfig_mapping("x86"), example)
    with torch.no_grad():
        for c in case.calibration:
            prepared(torch.tensor(c))
    return _engine("PyTorch int8", "int8", convert_fx(prepared), case, watch, "FX, x86 backend")


def _pt2e(case, dynamic):
    import torch
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    example = (torch.tensor(case.calibration[0]),)
    exported = torch.export.export(copy.deepcopy(case.model), example).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for c in case.calibration:
            prepared(torch.tensor(c))
    compiled = torch.compile(convert_pt2e(prepared))
    with torch.inference_mode():
        compiled(*example)  # inductor compiles on the first call
    return compiled


def torch_pt2e_int8(case: ModelCase, references) -> Engine:
    """PT2E + X86InductorQuantizer + torch.compile; static, and for transformers also dynamic
    activation quantization: the fastest accurate one."""
    import torch
    from torch._inductor import config as inductor_config

    watch = Stopwatch()
    torch.set_num_threads(case.threads)
    inductor_config.freezing = True
    built = {"static": _pt2e(case, False)}
    if case.transformer:
        built["dynamic"] = _pt2e(case, True)
    x = torch.tensor(case.inputs[0])
    cosines = {}
    for name, fn in built.items():
        with torch.inference_mode():
            outs = [fn(torch.tensor(i)).float().numpy() for i in case.inputs]
        cosines[name] = float(np.mean([cosine(o, r) for o, r in zip(outs, references)]))
    times = interleaved({n: (lambda f=f: _no_grad(f, x)) for n, f in built.items()}, rounds=6,
                        warmup=1)
    best = fastest_accurate(times, cosines)
    return _engine("PyTorch PT2E int8", "int8", built[best], case, watch,
                   f"X86InductorQuantizer {best}, inductor",
                   {"variants": {n: {"min_ms": times[n].min_ms, "cosine": cosines[n]}
                                 for n in built}})


def torch_bf16(case: ModelCase) -> Engine:
    """The module in bf16 (oneDNN bf16; AMX where the CPU has it), channels_last for images."""
    import torch

    watch = Stopwatch()
    fmt = torch.contiguous_format if case.transformer else torch.channels_last
    model = copy.deepcopy(case.model).to(torch.bfloat16).to(memory_format=fmt)
    return _engine("PyTorch bf16", "bf16",
                   lambda t: model(t.to(torch.bfloat16).contiguous(memory_format=fmt)),
                   case, watch, "bf16 module")


def _no_grad(fn, x):
    import torch

    with torch.inference_mode():
        return fn(x)
