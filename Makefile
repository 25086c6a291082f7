# gmeta-tf developer entry points. `make install` is idempotent: each step leaves a stamp in
# .venv and is skipped when its inputs have not changed, so a re-run never rebuilds Horovod.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2
HOROVOD_VERSION := 0.28.1
# Test processes (pytest-xdist); every test file runs whole in one of them (--dist loadfile).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

.PHONY: install test test-soak test-fast lint-imports demo bench profile quality lint clean
install: $(VENV)/.stamp-horovod $(VENV)/.stamp-package

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.stamp-base: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PIP) install --upgrade pip wheel "setuptools<70"
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	touch $@

# Horovod compiles against the installed TensorFlow, hence --no-build-isolation and Gloo-only.
$(VENV)/.stamp-horovod: $(VENV)/.stamp-base
	@if $(PY) -c "import horovod, horovod.tensorflow; assert horovod.__version__ == '$(HOROVOD_VERSION)'" 2>/dev/null; then \
	  echo "horovod $(HOROVOD_VERSION) already built"; \
	else \
	  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	  $(PIP) install --no-build-isolation --no-cache-dir horovod==$(HOROVOD_VERSION); \
	fi
	$(VENV)/bin/horovodrun --check-build | grep -E "TensorFlow|Gloo"
	touch $@

$(VENV)/.stamp-package: $(VENV)/.stamp-base setup.py
	$(PIP) install --no-deps --no-build-isolation -e .
	touch $@

# The full suite: unit and integration tiers, after the architecture contract. The soak tier
# (20 seeded start-order runs, the kill -9 sequence over five launches) runs on its own.
test: install lint-imports
	$(PYTEST) -m "not soak" tests

test-soak: install
	$(PY) -m pytest -q -m soak tests

# The unit tier (tests not marked `integration` in pytest.ini): no PS, horovodrun or long
# training; a few minutes on 2 cores.
test-fast: install lint-imports
	$(PYTEST) -m "not integration" tests

# The layers of docs/architecture.md, as written in .importlinter.
lint-imports: install
	$(VENV)/bin/lint-imports

demo: install
	$(VENV)/bin/gmeta demo --config configs/quickstart.yaml --out runs/demo

bench: install
	$(PY) -m bench.run

# Where the one-process meta step's time goes (docs/profile.md), dense math compiled and not.
profile: install
	$(PY) -m bench.profile_step

# The MovieLens cold-start comparison (examples/movielens): model quality, not speed.
quality: install
	$(PY) examples/movielens/run.py --out runs/movielens --json bench/quality.json

lint: install
	$(VENV)/bin/ruff check gmeta_tf ps launch bench tests
	$(VENV)/bin/lint-imports

clean:
	rm -rf runs bench/results.json .import_linter_cache
