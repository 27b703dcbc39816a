# Two commands do all the set-up on a fresh machine:
#   make run    the main job (creates .venv and installs unit-tvm when missing)
#   make test   the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.unit-tvm-installed

.PHONY: run demo test test-all typecheck clean cross-tools arm-python

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

BENCH_STAMP := $(VENV)/.unit-tvm-bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

# The main job: resnet18 compiled by unit-tvm (int8, tensorized, short tuning kept in the
# database) against TVM int8/fp32, PyTorch int8 and ONNX Runtime int8 on this host.
run: $(BENCH_STAMP)
	UNIT_TVM_QUIET=1 $(VENV)/bin/unit-tvm bench-model resnet18 --trials 16

# The op-level job of the earlier issues: peaks, then one tensorized GEMM and conv2d.
demo: $(STAMP)
	$(VENV)/bin/unit-tvm demo

# aarch64 kernels are executed under qemu: install the cross compiler and qemu-user when missing
# and possible (root with apt); otherwise those tests skip with the reason.
cross-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null \
	    && [ -d /usr/aarch64-linux-gnu ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user) >/dev/null 2>&1 \
	    || echo "note: could not install aarch64 tools; ARM execution tests will skip"; \
	else echo "note: not root or no apt; ARM execution tests will skip"; fi

# Whole aarch64 models run under qemu in an arm64 Python with TVM's aarch64 wheels (Debian's
# arm64 packages unpacked into .venv/aarch64-python): made once when possible (root with apt),
# otherwise those tests skip with the reason.
ARM_STAMP := $(VENV)/aarch64-python/.ready
arm-python: $(STAMP) cross-tools
	@if [ -f $(ARM_STAMP) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && command -v qemu-aarch64 >/dev/null; \
	then ($(PY) -m unit_tvm.cross.arm_python setup >/dev/null && touch $(ARM_STAMP)) \
	    || echo "note: could not set up the aarch64 Python; whole-model ARM tests will skip"; \
	else echo "note: not root or no apt/qemu; whole-model ARM tests will skip"; fi

# Two pytest workers (pytest-xdist): most of a test's time is one LLVM build on one core, so
# on CI's 2 cores the suite takes about 70% of the time of one process.
TEST_WORKERS ?= 2

# mypy checks the two extension points (intrinsics/, schedules/; mypy.ini): their signatures
# are the contract a new instruction or strategy is written against. They install as
# unit_tvm.intrinsics / unit_tvm.schedules (setup.py's package_dir), which mypy cannot read
# from the editable install: it runs in a folder of links that lays the package out that way.
TYPECHECK := $(VENV)/typecheck
typecheck: $(STAMP)
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/unit_tvm
	ln -s $(CURDIR)/unit_tvm/* $(CURDIR)/intrinsics $(CURDIR)/schedules $(TYPECHECK)/unit_tvm/
	cd $(TYPECHECK) && MYPYPATH=. $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/mypy.ini \
	    --cache-dir $(CURDIR)/$(VENV)/.mypy_cache -p unit_tvm.intrinsics -p unit_tvm.schedules

test: $(STAMP) cross-tools arm-python typecheck
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) -m "not slow" tests

test-all: $(STAMP) cross-tools arm-python typecheck
	$(PY) -m ruff check .
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) tests

clean:
	rm -rf $(VENV) *.egg-info
