"""The environment of the test processes and of what they start: the switches the tests
set (TEST_ENV), the environment a user's process has instead (user_env), and the shared
data folder. Imports nothing of TensorFlow: tests/conftest.py applies TEST_ENV before
TensorFlow is imported."""

import os

# oneDNN off in the test processes and the processes they start (TensorFlow runs Eigen, as
# on CPUs without AVX-512): its layout pass and primitive creation cost CPU on every new
# function and shape, which a test runs a few times (two test files took 71-81 s of CPU
# instead of 87-89 with it; bench/README.md, "Test suite"), and it changes results only
# within float rounding. The documented commands, the fresh-process and C++-loader checks
# run with the machine's own setting, as users do (user_env); TF_ENABLE_ONEDNN_OPTS set by
# the caller is kept. TensorFlow's own CPU allocator, as users have it: the BFC one keeps
# every region it grew to, and a worker that ran a third of the suite's files held 7 GiB
# (test_train_memory.py, which reads its statistics, starts a process with it).
TEST_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0"}
CALLER_ENV = {name: os.environ.get(name) for name in TEST_ENV}  # None: TensorFlow's default


def set_test_env():
    """TEST_ENV into this process' environment (a caller's own values are kept)."""
    for name, value in TEST_ENV.items():
        os.environ.setdefault(name, value)


def user_env(**extra):
    """The environment of a process started as a user starts it: this process' own, with
    TEST_ENV's variables as the caller had them (unset: TensorFlow's defaults), and
    `extra`. Such a process imports TensorFlow with its default oneDNN
    setting (and runs Grappler and the garbage collector as they come unless it is told
    otherwise: the switches the test processes set are no environment variables)."""
    env = {k: v for k, v in os.environ.items()
           if k not in TEST_ENV and k != "PYTEST_CURRENT_TEST"}
    env.update({k: v for k, v in CALLER_ENV.items() if v is not None}, **extra)
    return env


# Multi30k and newstest2014 for the data, training and shipped-model tests: `../shared/data`
# beside the repository, or the folder that TFXFORMER_SHARED_DATA names.
SHARED_DATA = os.environ.get("TFXFORMER_SHARED_DATA") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
MISSING_DATA = (f"test data folder {SHARED_DATA!r} not found: set TFXFORMER_SHARED_DATA to "
                "the folder that holds multi30k/ (and wmt14/)")

