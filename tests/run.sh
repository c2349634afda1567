#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up (tests/setup.sh), lint, type-check, pytest.
# Arguments go to pytest, for example
#   bash tests/run.sh -m "not oracle"      # the fast tier
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/setup.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
