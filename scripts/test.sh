#!/usr/bin/env bash
# Sets up the environment, then runs the linter and the test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3
ruff check .
python -m pytest -q -p no:warnings tests "$@"
