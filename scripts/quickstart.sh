#!/usr/bin/env bash
# Sets up the environment, then runs the main job on defaults that work offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3
python scripts/demo.py "$@"
