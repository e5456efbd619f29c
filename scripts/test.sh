#!/usr/bin/env bash
# Sets up the environment, then runs the linter and the test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3
ruff check .
# Two workers (CI has 2 cores; much of a test's time is single-threaded tracing and
# process start-up); a file's tests stay in one worker (module fixtures are built once).
python -m pytest -q -p no:warnings -n 2 --dist loadfile tests "$@"
