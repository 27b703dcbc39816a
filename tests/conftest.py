"""Shared fixtures: host target, ISA skips that print their reason, seeded RNG."""

import numpy as np
import pytest

import unit_tvm  # checks the pinned versions before any test
from unit_tvm import intrinsics
from unit_tvm.runner import prepare_host
from unit_tvm.target import features, host, is_host, restricted


def pytest_configure(config):
    """Kernels the tests build with TVM directly run on every CPU, as unit-tvm's own do."""
    prepare_host()


@pytest.fixture(scope="session")
def host_target():
    return host()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def require_host(name):
    """Skip (with the missing feature in the reason) when this host cannot execute `name`."""
    missing = intrinsics.get(name).missing_features(host())
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)}, which this CPU lacks")


def has_gpu():
    """Whether TVM sees a CUDA GPU here (a runtime built without CUDA has none)."""
    import tvm

    try:
        return tvm.cuda(0).exist
    except Exception:  # noqa: BLE001
        return False


def gpu_output(mod, x, quantize=None):
    """`unit_tvm.compile(mod)` for this machine's CUDA GPU (its own sm_XY) run on the numpy
    input `x`: the first output as float64 numpy."""
    import numpy as np
    import tvm
    from tvm import relax

    target = unit_tvm.target.cuda_target(tvm.cuda(0))
    vm = relax.VirtualMachine(unit_tvm.compile(mod, target, quantize=quantize), tvm.cuda(0))
    out = vm["main"](tvm.runtime.tensor(x, tvm.cuda(0)))
    return (out if hasattr(out, "numpy") else out[0]).numpy().astype(np.float64)


# the x86 vector instructions (AMX tiles aside), read off the registry: a new one is tested too
HOST_X86 = [i.name for i in intrinsics.all() if i.arch == "x86_64" and not i.tile]


def x86_classes():
    """[(name, target)]: this host, and the AVX2 class where the host has AVX-512 (kernels
    whose blocks follow the vector width are checked on both)."""
    out = [("native", host())]
    avx2 = restricted("avx2")
    if is_host(avx2) and "avx512f" in features(host()):
        out.append(("avx2", avx2))
    return out


def tiny_decoder(layers: int, vocab: int, tied: bool = True):
    """(DecoderConfig, DecoderWeights) of a seeded Llama of a few kilobytes (hidden 64, FFN 96,
    4 query / 2 key-value heads), for tests of unit_tvm.llm's graph."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from unit_tvm.llm import config, weights

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=tied)).eval()
    return config.from_hf(model), weights.from_hf(model)
