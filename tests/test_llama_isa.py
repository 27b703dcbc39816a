"""llama.cpp held to an ISA level (unit_tvm.bench.llama_isa): the CMake switches of the held
build follow unit_tvm.target's levels on this CPU. The build itself (6 minutes) belongs to the
benchmark, not the tests."""

import sys
from importlib import metadata

import pytest

from unit_tvm import target
from unit_tvm.bench import llama_isa


def _switches(level):
    return dict(a[2:].split("=") for a in llama_isa.cmake_args(level) if a.startswith("-D"))


def test_avx2_level_builds_no_avx512_and_no_vnni():
    on = {k for k, v in _switches("avx2").items() if v == "ON"}
    assert not {k for k in on if "AVX512" in k or "VNNI" in k or "AMX" in k}, on
    assert _switches("avx2")["GGML_NATIVE"] == "OFF"  # no -march=native behind the switches


@pytest.mark.parametrize("level", list(target.ISA_LEVELS))
def test_switches_on_are_the_features_the_level_keeps(level):
    have = target.features(target.restricted(level))
    for name, value in _switches(level).items():
        if name == "GGML_NATIVE":
            continue
        needs = llama_isa.GGML_SWITCHES[name]
        assert (value == "ON") == all(f in have for f in needs), (level, name, value)


def test_native_is_not_held_and_avx2_is_held_only_above_avx2():
    assert not llama_isa.is_held("native")
    assert not llama_isa.is_held("avx512_core_amx")  # turns nothing off
    native = target.features(target.restricted("native"))
    if "avx512f" in native:
        assert llama_isa.is_held("avx2")
    if not native & {"avx512f", "avxvnni"}:  # an AVX2 server (Zen 3, Haswell): nothing held
        assert not llama_isa.is_held("avx2")


def test_use_build_for_native_leaves_the_installed_build():
    path = list(sys.path)
    assert llama_isa.use_build_for("native") is None
    assert sys.path == path


def test_build_folder_is_keyed_by_switches():
    try:
        metadata.version(llama_isa.PACKAGE)
    except metadata.PackageNotFoundError:
        pytest.skip("llama-cpp-python is not installed (the bench extra)")
    folders = {lv: llama_isa.build_folder(lv) for lv in target.ISA_LEVELS}
    for a in folders:
        for b in folders:
            same = llama_isa.cmake_args(a) == llama_isa.cmake_args(b)
            assert (folders[a].name.split("-")[-1] == folders[b].name.split("-")[-1]) == same


def test_without_extra_buffers_switches_them_off_and_back():
    """llama.cpp's AMX buffers crash on some hosts (unit_tvm.bench.llama_buffers): the engine
    then loads with use_extra_bufts off, and only within the context manager."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llama_cpp import llama as high_level

    from unit_tvm.bench import llama_buffers

    defaults = high_level.llama_cpp.llama_model_default_params
    assert defaults().use_extra_bufts
    with llama_buffers.without_extra_buffers():
        assert not high_level.llama_cpp.llama_model_default_params().use_extra_bufts
    assert high_level.llama_cpp.llama_model_default_params is defaults
