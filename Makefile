# gmeta-tf developer entry points. `make install` is idempotent: each step leaves a stamp in
# .venv and is skipped when its inputs have not changed, so a re-run never rebuilds Horovod.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The package sets it itself (gmeta_tf/__init__.py); this is for the tools run here that import
# TensorFlow without it (horovodrun --check-build).
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2
HOROVOD_VERSION := 0.28.1
# pip's own bootstrap of the venv (TFRA imports pkg_resources, gone from setuptools 70); the image
# installs the same (launch/image/wheelhouse.sh).
BOOTSTRAP := pip wheel "setuptools<70"
# Horovod is built once, as a wheel here, which `make install` installs and `make image` ships.
HOROVOD_WHEELS := $(VENV)/wheels
HOROVOD_WHEEL_GLOB := $(HOROVOD_WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl
# Test processes (pytest-xdist); every test file runs whole in one of them (--dist loadfile).
TEST_WORKERS ?= 2
# --durations: the slowest tests close every run, so a test that grows is seen where it grows.
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

.PHONY: install test test-soak test-fast lint-imports demo bench bench-smoke profile quality lint clean image image-test jax-venv jax-compare
install: $(VENV)/.stamp-horovod $(VENV)/.stamp-package

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.stamp-base: requirements.txt requirements-dev.txt | $(VENV)/bin/python
	$(PIP) install --upgrade $(BOOTSTRAP)
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	touch $@

# Horovod compiles against the installed TensorFlow, hence --no-build-isolation and Gloo-only.
# The wheel stays in $(HOROVOD_WHEELS) for `make image`.
$(VENV)/.stamp-horovod-wheel: $(VENV)/.stamp-base
	@if ls $(HOROVOD_WHEEL_GLOB) >/dev/null 2>&1; then \
	  echo "horovod $(HOROVOD_VERSION) wheel already built:" $(HOROVOD_WHEEL_GLOB); \
	else \
	  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	  $(PIP) wheel --no-build-isolation --no-deps --no-cache-dir -w $(HOROVOD_WHEELS) horovod==$(HOROVOD_VERSION); \
	fi
	touch $@

# A venv that already has Horovod (built before the wheel was kept) is left as it is.
$(VENV)/.stamp-horovod: $(VENV)/.stamp-base
	@if $(PY) -c "import horovod, horovod.tensorflow; assert horovod.__version__ == '$(HOROVOD_VERSION)'" 2>/dev/null; then \
	  echo "horovod $(HOROVOD_VERSION) already built"; \
	else \
	  $(MAKE) --no-print-directory $(VENV)/.stamp-horovod-wheel && \
	  $(PIP) install $(HOROVOD_WHEEL_GLOB); \
	fi
	$(VENV)/bin/horovodrun --check-build | grep -E "TensorFlow|Gloo"
	touch $@

$(VENV)/.stamp-package: $(VENV)/.stamp-base setup.py
	$(PIP) install --no-deps --no-build-isolation -e .
	touch $@

# The full suite: unit and integration tiers, after the architecture contract. The soak tier
# (20 seeded start-order runs, the kill -9 sequence over five launches) runs on its own.
test: install lint-imports
	$(PYTEST) -m "not soak and not image and not alone" tests
	$(PY) -m pytest -q -p no:xdist -m "alone and not soak and not image" tests

test-soak: install
	$(PY) -m pytest -q -m soak tests

# The unit tier (tests not marked `integration` in pytest.ini): no PS, horovodrun or long
# training; a few minutes on 2 cores.
test-fast: install lint-imports
	$(PYTEST) -m "not integration and not image" tests

# The layers of docs/architecture.md, as written in .importlinter.
lint-imports: install
	$(VENV)/bin/lint-imports

demo: install
	$(VENV)/bin/gmeta demo --config configs/quickstart.yaml --out runs/demo

bench: install
	$(PY) -m bench.run

# Every bench section (the on-request ones too) on tiny sizes, a few minutes: the sections' code
# runs as in `make bench`, into bench/out/smoke/results.json (never bench/results.json); exits
# non-zero naming every section that failed. `make test` runs it (tests/test_bench_smoke.py).
bench-smoke: install
	$(PY) -m bench.run --smoke

# Where the one-process meta step's time goes (docs/profile.md), dense math compiled and not.
profile: install
	$(PY) -m bench.profile_step

# Bench only, never `make install`: a separate venv with JAX (bench/requirements-jax.txt) for
# bench/jax_step.py, the same meta step as one jax.jit, to compare with TF's XLA program.
JAX_VENV := .venv-jax
jax-venv: $(JAX_VENV)/.stamp
$(JAX_VENV)/.stamp: bench/requirements-jax.txt
	$(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/pip install -r bench/requirements-jax.txt
	touch $@

# gmeta's one-process step and the JAX step alternating in one window, and their HLO counts
# (docs/profile.md, "TF's XLA program vs a JAX step"); the JSON (ratios with the jax, jaxlib and
# tensorflow versions that made them) also goes to bench/out/jax-compare/compare.json.
jax-compare: install jax-venv
	$(PY) -m bench.jax_compare --jax-python $(JAX_VENV)/bin/python

# The MovieLens cold-start comparison (examples/movielens): model quality, not speed.
quality: install
	$(PY) examples/movielens/run.py --out runs/movielens --json bench/quality.json --plot bench/quality.png

lint: install
	$(VENV)/bin/ruff check gmeta_tf ps launch bench tests
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

# The container image of docs/kubernetes.md, built here without any registry: the tools (podman,
# runc, mmdebstrap) installed when missing, a Debian bookworm base made with mmdebstrap, every
# wheel built on this host (launch/image/wheelhouse.sh), then `podman build` with pip offline.
# IMAGE_BASE=docker.io/library/debian:bookworm-slim uses a registry's base instead; TF_EXTRA=and-cuda and
# IMAGE_BUILD_ARGS for the GPU variant (docs/kubernetes.md).
IMAGE ?= localhost/gmeta-tf:$(shell sed -n 's/.*version="\([^"]*\)".*/\1/p' setup.py)
IMAGE_BASE_MADE_HERE := localhost/gmeta-tf-base:bookworm
IMAGE_BASE ?= $(IMAGE_BASE_MADE_HERE)
IMAGE_BUILD_ARGS ?=
TF_EXTRA ?=
PODMAN := launch/image/podman.sh
image: $(VENV)/.stamp-horovod-wheel
	launch/image/tools.sh
	@if [ "$(IMAGE_BASE)" = "$(IMAGE_BASE_MADE_HERE)" ]; then launch/image/base.sh $(IMAGE_BASE); fi
	PIP=$(PIP) BOOTSTRAP='$(BOOTSTRAP)' HOROVOD_WHEEL="$$(ls $(HOROVOD_WHEEL_GLOB) | head -1)" \
	  HOROVOD_VERSION=$(HOROVOD_VERSION) \
	  TF_EXTRA=$(TF_EXTRA) launch/image/wheelhouse.sh build/wheelhouse
	$(PODMAN) build --format docker --network host --build-arg BASE_IMAGE=$(IMAGE_BASE) $(IMAGE_BUILD_ARGS) -t $(IMAGE) -f Dockerfile .
	@$(PODMAN) image inspect --format '{{.Id}} {{.Size}}' $(IMAGE) | \
	  awk '{printf "image $(IMAGE): %.0f MB (id %.12s)\n", $$2 / 1e6, $$1}'

# Starts the image and checks what it computes (tests/image, about 2 minutes); not in `make test`.
image-test: install
	GMETA_TEST_IMAGE=$(IMAGE) $(PY) -m pytest -q -p no:xdist -m image tests/image

clean:
	rm -rf runs bench/results.json .import_linter_cache
