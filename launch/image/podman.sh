#!/usr/bin/env bash
# podman with this project's containers.conf (see that file for why each setting is there).
# Every podman call of `make image` and `make image-test` goes through here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
exec podman "$@"
