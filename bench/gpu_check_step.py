"""The training-step part of bench/gpu_check.sh: one JSON line per figure.

Per precision (fp16 with loss scaling, bf16) and with/without XLA: the base model's real
step (`Trainer.step` through a `DeviceFeed`, results read once at the end) on 25,000-token
batches (390 pairs x 64 tokens per side), target tokens/s, MFU against the GPU's dense
peak for that precision, and peak device memory. Then MirroredStrategy over all GPUs
found, the global batch N times larger. `--mode cpu` runs the same code at tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flops  # noqa: E402

from tfxformer.config import PRECISION_POLICIES, get_preset  # noqa: E402
from tfxformer.distribute import make_strategy, mirrored_strategy, split_cpu  # noqa: E402
from tfxformer.models.transformer import Transformer  # noqa: E402
from tfxformer.schedules import TransformerSchedule, paper_adam  # noqa: E402
from tfxformer.trainer import Trainer  # noqa: E402

# Dense fp16/bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets (SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0,
               "L4": 121.0, "V100": 125.0}


def peak_tflops(name: str) -> float | None:
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return None


def _batch(rows, length, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, (rows, length)).astype("int32")
    return (ids, ids), ids


def time_step(strategy, preset, vocab, precision, xla, rows, length, steps, warmup):
    """(tokens/s, seconds per step, peak device memory MiB or None) of the real step."""
    keras.mixed_precision.set_global_policy(PRECISION_POLICIES[precision])
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = Transformer(get_preset(preset, vocab_size=vocab))
        model.build()
        optimizer = paper_adam(TransformerSchedule(model.model_config.d_model, 4000))
        if precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    trainer = Trainer(model, optimizer, strategy, jit_compile=xla)
    data = tf.data.Dataset.from_tensors(_batch(rows, length, vocab)).repeat()
    feed = trainer.feed(iter(data))
    gpu = bool(tf.config.list_physical_devices("GPU"))
    for _ in range(warmup):
        feed.fill(1)
        trainer.step(feed.pop())["record"].numpy()
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
    began = time.perf_counter()
    results = []
    for remaining in range(steps, 0, -1):
        feed.fill(remaining)
        results.append(trainer.step(feed.pop())["record"])
    records = tf.stack(results).numpy()  # the only read: like the training loop's sync
    seconds = (time.perf_counter() - began) / steps
    memory = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 20 if gpu else None
    tokens = float(records[:, 2].mean())
    keras.mixed_precision.set_global_policy("float32")
    return tokens / seconds, seconds, memory, bool(records[:, 3].all()), trainer.traces


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("gpu", "cpu"), default="gpu",
                        help="gpu: the base preset on the GPUs; cpu: a tiny dry run on 2 "
                             "logical CPUs (default: gpu)")
    parser.add_argument("--gpu-name", default="",
                        help="the GPU's name (nvidia-smi), for its peak TFLOP/s and the MFU")
    args = parser.parse_args(argv)
    if args.mode == "cpu":
        split_cpu(2)  # before any op: the MirroredStrategy figure uses 2 CPU replicas
    if args.mode == "gpu":
        preset, vocab, rows, length, steps, warmup = "base", 32000, 390, 64, 20, 3
    else:
        preset, vocab, rows, length, steps, warmup = "tiny", 400, 8, 16, 3, 1
    cfg = get_preset(preset, vocab_size=vocab).to_dict()
    flop_kwargs = dict(vocab=vocab, d_model=cfg["d_model"], d_ff=cfg["d_ff"],
                       layers=cfg["num_layers"])
    peak = peak_tflops(args.gpu_name)
    devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
        [tf.config.list_logical_devices("CPU")[0].name]
    one = mirrored_strategy((devices[0],))
    for precision in ("fp16", "bf16"):
        for xla in (False, True):
            tok_s, sec, mem, applied, traces = time_step(one, preset, vocab, precision, xla,
                                                         rows, length, steps, warmup)
            gflop = flops.train_step_flops(rows, length, length, **flop_kwargs) / 1e9
            print(json.dumps({
                "figure": "train_step", "preset": preset, "precision": precision, "xla": xla,
                "batch": [rows, length], "steps": steps, "step_ms": round(sec * 1e3, 2),
                "target_tokens_per_second": round(tok_s),
                "tflop_per_s": round(gflop / sec / 1e3, 1),
                "mfu": round(gflop / sec / 1e3 / peak, 3) if peak else None,
                "peak_tflops": peak, "peak_device_memory_mib": round(mem) if mem else None,
                "all_applied": applied, "step_traces": traces}), flush=True)
    strategy = make_strategy(None if args.mode == "gpu" else 2)
    replicas = strategy.num_replicas_in_sync
    tok_s, sec, mem, applied, _ = time_step(strategy, preset, vocab, "bf16", False,
                                            rows * replicas, length, steps, warmup)
    single, _, _, _, _ = time_step(one, preset, vocab, "bf16", False, rows, length, steps,
                                   warmup)
    print(json.dumps({"figure": "mirrored_all_devices", "replicas": replicas,
                      "precision": "bf16", "global_batch": [rows * replicas, length],
                      "target_tokens_per_second": round(tok_s), "step_ms": round(sec * 1e3, 2),
                      "one_device_target_tokens_per_second": round(single),
                      "scaling_efficiency": round(tok_s / single / replicas, 3),
                      "all_applied": applied}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
