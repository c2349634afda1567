#!/usr/bin/env bash
# Builds the constraintd image from this working tree.
#
# Usage: deploy/build-image.sh [--tag TAG] [--local-base] [--base IMAGE] [--wheelhouse] [--warm-vocab GGUF]
#   --tag TAG          the image's tag (default constraintd:dev)
#   --local-base       build on constraintd-base:bookworm, made by deploy/base/build-base.sh from Debian's
#                      packages when it is not there yet (for hosts that cannot pull images)
#   --base IMAGE       build on IMAGE (default python:3.11-slim-bookworm)
#   --wheelhouse       fetch the wheels on this host (`pip wheel`) and install them in the image with no
#                      network access (for hosts whose containers cannot reach the package index)
#   --warm-vocab GGUF  prepare this GGUF's vocabulary at build time (`constraintd warm`), so the server loads
#                      it instead of reading it; repeat for several
#
# The build context is a fresh directory holding only what the Dockerfile copies (the package sources,
# pyproject.toml, README.md, LICENSE and a few deploy/ files), so neither a virtual environment nor the git
# history is sent to the Docker daemon, whichever builder it uses.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=constraintd:dev
base=python:3.11-slim-bookworm
local_base=0
pip_source=index
warm_vocabs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --local-base) local_base=1; base=constraintd-base:bookworm; shift ;;
    --wheelhouse) pip_source=wheelhouse; shift ;;
    --warm-vocab) warm_vocabs+=("$2"); shift 2 ;;
    *) echo "build-image.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done

if [ "$local_base" = 1 ] && ! docker image inspect "$base" >/dev/null 2>&1; then
  bash deploy/base/build-base.sh "$base"
fi

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
tar --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - \
  pyproject.toml README.md LICENSE constraintd clients sampler_worker \
  deploy/Dockerfile deploy/grpc_health_probe.py deploy/entrypoint.sh deploy/wheelhouse/README.md \
  deploy/warm/README.md | tar -xf - -C "$context"

if [ "$pip_source" = wheelhouse ]; then
  # The wheels must suit the image's Python (3.11, glibc, this machine's architecture).
  python="${PYTHON:-python3}"
  version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$version" != 3.11 ]; then
    echo "build-image.sh: --wheelhouse needs a Python 3.11 on this host (PYTHON=...), found $version" >&2
    exit 1
  fi
  "$python" -m pip wheel --quiet --wheel-dir "$context/deploy/wheelhouse" "$context"
fi

warm_names=
for warm_vocab in "${warm_vocabs[@]}"; do
  warm_name="$(basename "$warm_vocab")"
  case "$warm_name" in
    *[[:space:]]*) echo "build-image.sh: --warm-vocab: a file name without spaces, please: '$warm_name'" >&2; exit 2 ;;
  esac
  cp "$warm_vocab" "$context/deploy/warm/$warm_name"
  warm_names="${warm_names:+$warm_names }$warm_name"
done

docker build --file "$context/deploy/Dockerfile" --tag "$tag" \
  --build-arg "BASE_IMAGE=$base" --build-arg "PIP_SOURCE=$pip_source" --build-arg "WARM_VOCAB=$warm_names" \
  "$context"
echo "built $tag on $base (pip source: $pip_source)"
