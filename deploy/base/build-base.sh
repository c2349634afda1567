#!/usr/bin/env bash
# Builds a local base image equivalent to `python:3.11-slim-bookworm` from Debian's own packages, for
# machines that reach Debian's package archive but no container registry.
#
# What the image has, and why it can stand in for the standard base:
# - Debian 12 (bookworm), the release the standard slim image is built on, with the packages of priority
#   required (mmdebstrap's `minbase` variant, as `debian:bookworm-slim` has them);
# - CPython 3.11 from Debian (`python3`, `python` through python-is-python3) and `python3-venv`, so
#   `python3 -m venv` brings pip, as the standard image's interpreter does;
# - ca-certificates, LANG=C.UTF-8 and `python3` as the default command, as in the standard image.
# It differs in where Python lives (/usr/bin rather than /usr/local/bin) and in its patch release; the
# constraintd Dockerfile only calls `python3` from PATH and builds a venv, so it works on both.
#
# Usage: deploy/base/build-base.sh [TAG]            (default tag: constraintd-base:bookworm)
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SECURITY_MIRROR,
# SOURCE_DATE_EPOCH (for a reproducible root file system).
# Needs: mmdebstrap (Debian package `mmdebstrap`), a running Docker daemon, and root (or a user that may
# unshare user namespaces, which mmdebstrap then uses by itself).
set -euo pipefail

tag="${1:-constraintd-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
suite=bookworm

for tool in mmdebstrap docker; do
  if ! command -v "$tool" >/dev/null; then
    echo "build-base.sh: '$tool' is not installed" >&2
    exit 1
  fi
done

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT

# Documentation, manual pages and translations are not needed in a service image; dpkg never unpacks them.
mmdebstrap \
  --variant=minbase \
  --include=python3,python3-venv,python-is-python3,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --aptopt='APT::Install-Recommends "false"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log' \
  "$suite" "$workdir/rootfs.tar" \
  "deb $mirror $suite main" \
  "deb $mirror $suite-updates main" \
  "deb $security $suite-security main"

python_version="$(tar -xOf "$workdir/rootfs.tar" ./var/lib/dpkg/status \
  | awk '/^Package: python3.11-minimal$/ {found = 1} found && !done && /^Version:/ {print $2; done = 1}')"

docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL org.opencontainers.image.title=constraintd-base org.opencontainers.image.base.name=debian:$suite org.constraintd.python.version=$python_version" \
  --change 'CMD ["python3"]' \
  "$workdir/rootfs.tar" "$tag"

echo "built $tag (Debian $suite, Python $python_version)"
