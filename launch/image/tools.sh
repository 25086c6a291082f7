#!/usr/bin/env bash
# The Debian packages `make image` and `make image-test` use, installed only when missing, so a
# fresh machine gets from zero to an image with `make image` alone:
#   podman       builds and runs the image (no Docker daemon needed)
#   runc         podman's runtime here (crun refuses this machine's cgroups: containers.conf)
#   mmdebstrap   makes the Debian base image from Debian's own packages (no registry needed)
#   slirp4netns  a network namespace with published ports for `gmeta serve` in image-test
#   uidmap       newuidmap/newgidmap, which podman calls for user namespaces
set -euo pipefail
packages=(podman runc mmdebstrap slirp4netns uidmap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "image tools: ${packages[*]} already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "error: make image needs the Debian packages ${missing[*]} and this machine has no apt-get;" \
       "install podman, runc and mmdebstrap by hand" >&2
  exit 2
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "error: installing ${missing[*]} needs root (or sudo)" >&2; exit 2; }
  sudo=(sudo)
fi
echo "image tools: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
