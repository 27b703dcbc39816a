"""Whether llama.cpp may put its weights in its extra buffer types on this host.

llama.cpp built for an AMX CPU repacks Q8_0 / Q4_0 weights into "AMX" buffers and multiplies them
with tile instructions. On some AMX hosts that path crashes the process in its first evaluation
(ggml-org/llama.cpp#20824; seen on a 2-vCPU Xeon VM with llama-cpp-python 0.3.36, Q8_0 and Q4_0
alike). A crash cannot be caught in-process, so a child process tries it once per file; where it
dies, bench-llm loads llama.cpp without extra buffer types (no AMX and no repacked weights:
its plain vector dot products) and names the engine so."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

# prompt long enough to take the matrix-matrix path, then one decode step
_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=128, n_batch=64, n_ubatch=64,
            n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]), verbose=False)
llm.eval(list(range(1, 65)))
llm.eval([1])
"""
PROBE_SECONDS = 600


def has_amx_build() -> bool:
    """Whether the imported llama.cpp was compiled with its AMX int8 kernels."""
    import llama_cpp

    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def extra_buffers_run(path, threads: int) -> bool:
    """Whether llama.cpp with its default (extra) buffer types evaluates `path` without
    crashing: always where it has no AMX kernels, else by a child process's exit status."""
    if not has_amx_build():
        return True
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(threads)],
                              capture_output=True, timeout=PROBE_SECONDS, check=False)
    except subprocess.TimeoutExpired:  # a hang is no better than a crash
        return False
    return done.returncode == 0


@contextmanager
def without_extra_buffers():
    """Within it, llama-cpp-python loads models with use_extra_bufts off (its Llama class
    takes no such argument: it starts from llama_model_default_params, swapped here)."""
    from llama_cpp import llama as high_level

    low_level = high_level.llama_cpp
    default = low_level.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    low_level.llama_model_default_params = params
    try:
        yield
    finally:
        low_level.llama_model_default_params = default
