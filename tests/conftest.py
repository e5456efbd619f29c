"""Shared test setup: quiet TensorFlow, 8 logical CPU devices for MirroredStrategy tests,
the shared data folder, and the `slow` tier.

Tests marked `slow` (`pytest.ini`) train, spawn processes, compile C++ or run an export script
end to end; `pytest -m "not slow"` runs the rest, the inner loop of a change; CI runs everything.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# The paper trained on 8 GPUs; tests split the CPU into 8 logical devices instead. This must
# happen before TensorFlow initialises its devices, i.e. before any op runs.
NUM_LOGICAL_CPUS = 8
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)

# Multi30k and newstest2014 for the data, training and shipped-model tests: `../shared/data`
# beside the repository, or the folder that TFXFORMER_SHARED_DATA names.
SHARED_DATA = os.environ.get("TFXFORMER_SHARED_DATA") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
MISSING_DATA = (f"test data folder {SHARED_DATA!r} not found: set TFXFORMER_SHARED_DATA to "
                "the folder that holds multi30k/ (and wmt14/)")


def shared_data(*parts):
    """The path of `parts` under SHARED_DATA; FileNotFoundError saying how to point the tests
    at the data when it is missing."""
    path = os.path.join(SHARED_DATA, *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{MISSING_DATA}; missing: {path!r}")
    return path


def pytest_report_header(config):
    found = "found" if os.path.isdir(SHARED_DATA) else f"MISSING ({MISSING_DATA})"
    return f"tfxformer shared data: {SHARED_DATA} ({found})"


@pytest.fixture
def tiny_config():
    """The ModelConfig of a tiny Transformer (the "tiny" preset, vocabulary of 64)."""
    from tfxformer.config import get_preset

    return get_preset("tiny", vocab_size=64)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Every test starts from the same seed and the float32 policy."""
    import keras

    keras.utils.set_random_seed(1234)
    yield
    keras.mixed_precision.set_global_policy("float32")


def strategy_over(num_replicas):
    """The MirroredStrategy over the first `num_replicas` logical CPU devices."""
    from tfxformer.distribute import mirrored_strategy

    names = [d.name for d in tf.config.list_logical_devices("CPU")][:num_replicas]
    return mirrored_strategy(tuple(names))
