# Two commands do all the set-up on a fresh machine:
#   make run    the main job (creates .venv and installs unit-tvm when missing)
#   make test   the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.unit-tvm-installed

.PHONY: run test test-all clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/unit-tvm demo

test: $(STAMP)
	$(PY) -m pytest -q -rs -m "not slow" tests

test-all: $(STAMP)
	$(PY) -m pytest -q -rs tests

clean:
	rm -rf $(VENV) *.egg-info
