#!/usr/bin/env bash
# Creates (or reuses) .venv with Python 3.11 and installs tfxformer with its test tools.
# The installer is uv (Astral's pip-compatible one, from PyPI): it fetches, unpacks and
# compiles the pinned packages in parallel, a new environment in about half pip's time
# (bench/README.md, "Test suite"). --compile-bytecode: as pip, it writes the .pyc files at
# install time (where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile
# TensorFlow's modules again). TFXFORMER_INSTALLER=pip installs with pip instead; so does
# this script when uv cannot be installed or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if [ "${TFXFORMER_INSTALLER:-uv}" = uv ] && python -m pip install -q "uv>=0.13,<0.14" &&
    uv pip install -q --compile-bytecode -e ".[test]"; then
  :
else
  echo "setup_env.sh: installing with pip (TFXFORMER_INSTALLER=${TFXFORMER_INSTALLER:-uv};" \
       "uv unavailable or failed)" >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[test]"
fi
