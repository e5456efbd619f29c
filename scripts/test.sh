#!/usr/bin/env bash
# Sets up the environment, then runs the linter and the test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3
ruff check .
# Three workers on CI's 2 cores (a worker often waits: on a process a test started, a
# shared build, a file lock; three keep both cores busy); a file's tests stay in one
# worker (module fixtures are built once).
# The trained run dir, exports and references that several files use are built once per
# session and shared by the workers; the longest files start first (by tests/durations.json,
# which `bash scripts/test.sh --record-durations` rewrites from this run: --no-loadscope-reorder
# keeps pytest-xdist from ordering files by test count).
# The longest file, the documented commands (tests/test_docs_run.py), runs its pages two at
# a time in its worker, beside the other workers' files, so that it does not run on alone
# at the end; a script's first documented command starts as a new interpreter, as users
# start it, its other commands as forks of a process that has imported TensorFlow.
# The test processes run TensorFlow with cheaper settings (tests/conftest.py); the tests
# marked user_env, documented commands among them, start their processes as users do.
# The 20 slowest tests are listed at the end: what to look at when the suite grows.
python -m pytest -q -p no:warnings -n 3 --dist loadfile --no-loadscope-reorder --durations=20 tests "$@"

# Apache Beam's tests (tests/test_beam.py, its fast tier) in an environment of their own,
# .venv-beam with tfxformer[test,beam]: Beam pins protobuf < 7, so the suite above runs with
# the protobuf users of the core package get, and these with Beam's (setup.py, "beam").
# The fast tier: the readers, the output formats and one pipeline per signature on the tiny
# export, run in the test process (the slow tests start the script's processes).
# TFXFORMER_BEAM_TESTS=0 skips them.
if [ "${TFXFORMER_BEAM_TESTS:-1}" != 0 ]; then
  [ -x .venv-beam/bin/python ] || "${PYTHON:-python3.11}" -m venv .venv-beam
  if command -v uv > /dev/null; then
    uv pip install -q --compile-bytecode --python .venv-beam/bin/python -e ".[test,beam]"
  else
    .venv-beam/bin/python -m pip install -q -e ".[test,beam]"
  fi
  .venv-beam/bin/python -m pytest -q -p no:warnings -m "not slow" tests/test_beam.py
fi
