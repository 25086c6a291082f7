# gmeta-tf's container image: the `gmeta` command with TensorFlow, TFRA, Horovod (Gloo) and
# KServe, as the manifests of `gmeta k8s render` (TFJob) and `gmeta k8s render-serving`
# (InferenceService) run it. `make image` builds it (docs/kubernetes.md, "The container image").
#
# pip never reaches an index here: every package comes from build/wheelhouse (made on the host by
# launch/image/wheelhouse.sh from requirements.txt and the Makefile), so a rebuild installs the
# same files, offline. No package version is written in this file; the one version it names is the
# interpreter's, once, as the default of the PYTHON build argument (the Makefile's PYTHON).
#
# Stages: venv (the pinned stack in /opt/gmeta) -> build (Horovod, gmeta-tf itself, checks) ->
# runtime (python and the venv; no compiler, no pip cache, no wheelhouse; runs as uid 1000).
#
# Build arguments:
#   BASE_IMAGE      runtime base; debian:bookworm-slim (its python is the venv's of make install).
#                   `make image` passes the bookworm image it makes with mmdebstrap.
#   BUILD_IMAGE     base of the build stages (default: BASE_IMAGE).
#   PYTHON          the Debian/Ubuntu package and command of the interpreter (default below).
#   HOROVOD_FROM    wheelhouse (the wheel `make install` built, Gloo, CPU) or source (compile
#                   Horovod here against the installed TensorFlow: the GPU variant with NCCL).
#   HOROVOD_GPU_OPERATIONS   NCCL for the GPU variant (with HOROVOD_FROM=source); empty for CPU.
ARG BASE_IMAGE=debian:bookworm-slim
ARG BUILD_IMAGE=${BASE_IMAGE}
ARG HOROVOD_FROM=wheelhouse
ARG PYTHON=python3.11

FROM ${BUILD_IMAGE} AS venv
ARG PYTHON
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" \
 && rm -rf /var/lib/apt/lists/*
COPY build/wheelhouse/ /wheelhouse/
COPY requirements.txt /src/requirements.txt
# The same pins as `make install`: requirements.txt itself, resolved from the wheelhouse only.
RUN "${PYTHON}" -m venv /opt/gmeta \
 && /opt/gmeta/bin/pip install --no-index --find-links /wheelhouse --upgrade -r /wheelhouse/bootstrap.txt \
 && /opt/gmeta/bin/pip install --no-index --find-links /wheelhouse -r /src/requirements.txt -r /wheelhouse/tf-extra.txt

FROM venv AS build
ARG PYTHON
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG HOROVOD_FROM
ARG HOROVOD_GPU_OPERATIONS=
# HOROVOD_FROM=wheelhouse: the wheel `make install` built with Gloo against the same TensorFlow,
# no compiler. HOROVOD_FROM=source: compiled here against the TensorFlow installed above (the GPU
# variant: a CUDA devel BUILD_IMAGE and HOROVOD_GPU_OPERATIONS=NCCL); the compilers stay in this
# stage, the runtime stage copies /opt/gmeta only.
RUN if [ "${HOROVOD_FROM}" = wheelhouse ]; then \
      /opt/gmeta/bin/pip install --no-index --find-links /wheelhouse --only-binary horovod -r /wheelhouse/horovod.txt; \
    elif [ "${HOROVOD_FROM}" = source ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends g++ make cmake "${PYTHON}-dev" \
      && rm -rf /var/lib/apt/lists/* \
      && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
         HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS}" \
         /opt/gmeta/bin/pip install --no-index --find-links /wheelhouse --no-binary horovod --no-build-isolation \
         -r /wheelhouse/horovod.txt; \
    else \
      echo "HOROVOD_FROM must be wheelhouse or source, not '${HOROVOD_FROM}'" >&2; exit 2; \
    fi
COPY setup.py /src/
COPY gmeta_tf /src/gmeta_tf
COPY ps /src/ps
COPY launch /src/launch
# gmeta-tf without its dependencies (they are requirements.txt's, installed above); pip check
# then fails the build if setup.py's install_requires and requirements.txt disagree, and
# horovodrun --check-build if Horovod lacks TensorFlow or Gloo. TensorFlow's C++ headers (420 MB)
# only serve compiling ops against it, which is done: Horovod is built, TFRA ships its kernels.
RUN /opt/gmeta/bin/pip install --no-index --no-deps --no-build-isolation /src \
 && /opt/gmeta/bin/pip check \
 && TF_CPP_MIN_LOG_LEVEL=3 /opt/gmeta/bin/horovodrun --check-build | tee /tmp/check-build \
 && grep -q '\[X\] TensorFlow' /tmp/check-build && grep -q '\[X\] Gloo' /tmp/check-build \
 && rm -rf "$(/opt/gmeta/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tensorflow/include" \
 && /opt/gmeta/bin/pip freeze --all > /opt/gmeta/pip-freeze.txt

FROM ${BASE_IMAGE} AS runtime
ARG PYTHON
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
LABEL org.opencontainers.image.title="gmeta-tf" \
      org.opencontainers.image.description="Distributed meta-learning trainer for recommenders: gmeta train, ps serve, k8s entrypoint, serve"
# libstdc++6: TensorFlow, TFRA and Horovod are C++; ca-certificates: gs:// run directories and
# KServe's storage clients speak TLS.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PYTHON}" libstdc++6 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 gmeta \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash gmeta
COPY --from=build /opt/gmeta /opt/gmeta
# The example configs, so `gmeta demo` runs as it does in a checkout (its default is
# configs/quickstart.yaml, relative to the working directory).
COPY configs /opt/gmeta-tf/configs
RUN ln -s /opt/gmeta-tf/configs /home/gmeta/configs
# (TF_USE_LEGACY_KERAS: importing gmeta_tf sets it, before TensorFlow.)
ENV PATH=/opt/gmeta/bin:${PATH} \
    TF_CPP_MIN_LOG_LEVEL=2 \
    PYTHONUNBUFFERED=1
# Numeric, so that Kubernetes' runAsNonRoot can verify it; the TFJob's pods get fsGroup 1000 so
# this user can write the checkpoint volume.
USER 1000:1000
WORKDIR /home/gmeta
CMD ["gmeta", "--help"]
