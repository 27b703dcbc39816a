"""The TVM stack is the pinned one, and a wrong tvm-ffi is refused at import with the fix."""

import pytest

from unit_tvm import _pins


def test_installed_versions_equal_pins():
    tvm_v, ffi_v = _pins.installed_versions()
    assert tvm_v == _pins.TVM_VERSION == "0.27.0.post1"
    assert ffi_v == _pins.TVM_FFI_VERSION == "0.1.14.post1"


def test_setup_pins_match_runtime_pins():
    import pathlib

    text = (pathlib.Path(__file__).parent.parent / "setup.py").read_text()
    assert f'"apache-tvm=={_pins.TVM_VERSION}"' in text
    assert f'"apache-tvm-ffi=={_pins.TVM_FFI_VERSION}"' in text


def test_wrong_tvm_ffi_raises_clear_error(monkeypatch):
    monkeypatch.setattr(_pins, "installed_versions", lambda: (_pins.TVM_VERSION, "0.1.15.post2"))
    with pytest.raises(_pins.DependencyError) as err:
        _pins.check_versions()
    msg = str(err.value)
    assert "0.1.15.post2" in msg and "pip install 'apache-tvm-ffi==0.1.14.post1'" in msg


def test_wrong_tvm_raises_clear_error(monkeypatch):
    monkeypatch.setattr(_pins, "installed_versions", lambda: ("0.26.0", _pins.TVM_FFI_VERSION))
    with pytest.raises(_pins.DependencyError, match="apache-tvm==0.27.0.post1"):
        _pins.check_versions()
