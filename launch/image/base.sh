#!/usr/bin/env bash
# base.sh IMAGE: the Debian bookworm base image, made here from Debian's own packages
# (mmdebstrap) and imported with podman, for a machine that reaches no container registry. It
# mirrors what debian:bookworm-slim is: the minbase variant (essential packages and apt) without
# manual pages, documentation (copyright files stay) or translations. Skipped if IMAGE exists.
set -euo pipefail
image="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
podman=("$here/podman.sh")
if "${podman[@]}" image exists "$image"; then
  echo "base image $image already exists (podman rmi it to make it again)"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The machine's own apt sources when it runs bookworm (they carry the updates and security
# suites); otherwise mmdebstrap's default mirror for the suite.
sources=()
if [ -f /etc/apt/sources.list.d/debian.sources ] && grep -q "bookworm" /etc/apt/sources.list.d/debian.sources; then
  sources=(/etc/apt/sources.list.d/debian.sources)
fi
start=$SECONDS
mmdebstrap --variant=minbase --quiet \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --aptopt='Acquire::Languages "none"' \
  bookworm "$tmp/rootfs.tar" "${sources[@]}"
"${podman[@]}" import --quiet --change 'CMD ["/bin/bash"]' "$tmp/rootfs.tar" "$image" >/dev/null
echo "base image $image: bookworm minbase, $(du -m "$tmp/rootfs.tar" | cut -f1) MB, made in $((SECONDS - start)) s"
