#!/usr/bin/env bash
# Creates (or reuses) .venv with Python 3.11 and installs tfxformer with its test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
