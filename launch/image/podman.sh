#!/usr/bin/env bash
# podman with this project's containers.conf (see that file for why each setting is there).
# Every podman call of `make image` and `make image-test` goes through here.
#
# The file is layered on top of the machine's and the user's own containers.conf
# (CONTAINERS_CONF_OVERRIDE, read last, podman >= 4.5): their other settings (registries mirrors,
# storage, proxies) still apply. An older podman only has CONTAINERS_CONF, which *replaces* every
# other containers.conf: then the user's own is not read, and this script says so on stderr.
# A CONTAINERS_CONF or CONTAINERS_CONF_OVERRIDE already set is left alone.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
conf="$here/containers.conf"
if [[ -z "${CONTAINERS_CONF:-}" && -z "${CONTAINERS_CONF_OVERRIDE:-}" ]]; then
  version="$(podman version --format '{{.Client.Version}}' 2>/dev/null || echo 0)"
  if [[ "$(printf '%s\n' 4.5 "$version" | sort -V | head -n1)" == 4.5 ]]; then
    export CONTAINERS_CONF_OVERRIDE="$conf"
  else
    export CONTAINERS_CONF="$conf"
    echo "note: podman $version has no CONTAINERS_CONF_OVERRIDE; using only $conf (your own containers.conf is not read)" >&2
  fi
fi
exec podman "$@"
