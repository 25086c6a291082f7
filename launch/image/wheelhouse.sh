#!/usr/bin/env bash
# wheelhouse.sh OUT: every wheel the image installs, built on this host, so that the image build
# runs pip with --no-index (no TLS question inside the build, the same files on every rebuild).
# It takes its versions from the places `make install` takes them, never from a list of its own:
#   requirements.txt               the runtime pins (the Dockerfile installs `-r requirements.txt`)
#   $BOOTSTRAP                     the Makefile's pip/wheel/setuptools bootstrap (TFRA needs pkg_resources)
#   $HOROVOD_WHEEL                 the Horovod wheel `make install` built against the pinned TensorFlow
#   $TF_EXTRA (optional)           e.g. and-cuda: tensorflow[and-cuda] at requirements.txt's version (GPU)
# It also keeps Horovod's source distribution, for HOROVOD_FROM=source builds (GPU: NCCL).
# Environment: PIP (the venv's pip), BOOTSTRAP, HOROVOD_WHEEL, HOROVOD_VERSION, TF_EXTRA.
set -euo pipefail
out="$1"
: "${PIP:?}" "${BOOTSTRAP:?}" "${HOROVOD_WHEEL:?}" "${HOROVOD_VERSION:?}"
TF_EXTRA="${TF_EXTRA:-}"
BOOTSTRAP="${BOOTSTRAP//\"/}"  # the Makefile quotes "setuptools<70" for its shell
[ -f "$HOROVOD_WHEEL" ] || { echo "error: no Horovod wheel at $HOROVOD_WHEEL (make install builds it)" >&2; exit 2; }
key="$(cat requirements.txt; echo "$BOOTSTRAP $HOROVOD_VERSION $TF_EXTRA"; sha256sum "$HOROVOD_WHEEL")"
if [ -f "$out/.key" ] && [ "$(cat "$out/.key")" = "$key" ]; then
  echo "wheelhouse $out is up to date ($(du -sm "$out" | cut -f1) MB)"
  exit 0
fi
start=$SECONDS
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
tf_extra=()
if [ -n "$TF_EXTRA" ]; then
  tf_version="$(sed -n 's/^tensorflow==\([^ ;#]*\).*/\1/p' requirements.txt)"
  [ -n "$tf_version" ] || { echo "error: requirements.txt pins no tensorflow==VERSION" >&2; exit 2; }
  tf_extra=("tensorflow[$TF_EXTRA]==$tf_version")
fi
# One resolution for everything, so Horovod's own dependencies agree with requirements.txt.
# shellcheck disable=SC2086  # BOOTSTRAP is a list of requirement specifiers
"$PIP" wheel --quiet --wheel-dir "$tmp" -r requirements.txt "$HOROVOD_WHEEL" $BOOTSTRAP "${tf_extra[@]}"
"$PIP" download --quiet --no-deps --no-binary :all: --dest "$tmp" "horovod==$HOROVOD_VERSION"
# shellcheck disable=SC2086
printf '%s\n' $BOOTSTRAP > "$tmp/bootstrap.txt"
printf '%s\n' "${tf_extra[@]}" > "$tmp/tf-extra.txt"
echo "horovod==$HOROVOD_VERSION" > "$tmp/horovod.txt"
echo "$key" > "$tmp/.key"
rm -rf "$out"
mv "$tmp" "$out"
echo "wheelhouse $out: $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sm "$out" | cut -f1) MB, built in $((SECONDS - start)) s"
