"""Helpers shared by the benchmark scripts: environment, data, timing, reporting.

Import this before TensorFlow (it sets the log level and the Keras backend).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

# Token ids of the peers' bench_data.py: 0 pad, 1 BOS, 2 EOS, real tokens in [3, V).
# (tfxformer itself uses BOS 2 / EOS 3; in training only PAD = 0 matters.)
PEER_PAD, PEER_BOS = 0, 1
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def fixed_batches(n, batch=128, src_len=32, tgt_len=32, vocab=32000, seed=0):
    """The peers' `bench_data.fixed_batches` (same RNG calls, so the same ids for V=32000):
    n tuples (src, tgt_in, tgt) of int64 arrays, every token real (no padding)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        src = rng.integers(3, vocab, size=(batch, src_len), dtype=np.int64)
        tgt = rng.integers(3, vocab, size=(batch, tgt_len), dtype=np.int64)
        tgt_in = np.concatenate([np.full((batch, 1), PEER_BOS), tgt[:, :-1]], axis=1)
        out.append((src, tgt_in, tgt))
    return out


def workload_args(ap, batch_size: int, src_len: int, tgt_len: int | None) -> None:
    """The model and batch flags of the random-weight benchmarks (tgt_len None: none)."""
    ap.add_argument("--preset", default="base", help="model preset (base, big, small, tiny)")
    ap.add_argument("--vocab-size", type=int, default=32000, help="V (default: 32000)")
    ap.add_argument("--batch-size", type=int, default=batch_size,
                    help=f"B sentences or pairs (default: {batch_size})")
    ap.add_argument("--src-len", type=int, default=src_len,
                    help=f"S source tokens a sentence (default: {src_len})")
    if tgt_len is not None:
        ap.add_argument("--tgt-len", type=int, default=tgt_len,
                        help=f"T target tokens a pair (default: {tgt_len})")
    ap.add_argument("--precision", choices=sorted(POLICIES), default="fp32",
                    help="fp32 or bf16 (Keras mixed_bfloat16) (default: fp32)")


def stand_in_pool(rng, vocab: int, size: int) -> np.ndarray:
    """The ids of a stand-in vocabulary shortlist of `size` (the 4 special ids apart):
    `size - 4` distinct ids of 4 .. vocab - 1, drawn first from `rng` (default_rng(0) in
    decode_speed.py)."""
    return rng.choice(np.arange(4, vocab), size - 4, replace=False)


def quiet_tf() -> None:
    """Silences TensorFlow's Python logger (retracing notes when a script builds one
    tf.function per shape on purpose)."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


def set_precision(precision: str) -> str:
    """Sets the global Keras dtype policy for "fp32" or "bf16"; returns the policy name."""
    import keras

    quiet_tf()
    policy = POLICIES[precision]
    keras.mixed_precision.set_global_policy(policy)
    return policy


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def timed(fn, *args):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def spread(values, digits=3):
    """median / min / max of a list, rounded."""
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def machine() -> dict:
    """What ran the benchmark (CPU model, cores, versions) for the JSON line."""
    import keras
    import tensorflow as tf

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg_1min_at_end": load,
            "tensorflow": tf.__version__, "keras": keras.__version__}


def emit(result: dict) -> None:
    """Prints the one JSON line a benchmark ends with."""
    print(json.dumps(result), flush=True)


def log(message: str) -> None:
    print(message, flush=True)

