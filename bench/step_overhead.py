"""Host time per training step that is not model compute, on this CPU.

A trivial model (1 layer, d_model 8, vocabulary 16, 2 x 8 tokens) makes the compute of
a step small, so the wall time per step of the real training loop
(`tfxformer.training.train_loop`: data, step dispatch, metric reads, logging every
`--log-every` updates) is mostly host work. The compute is measured on its own: the same
update run `--steps` times inside ONE tf.function (an in-graph loop: no Python, no data,
no read per step). Then

    host_ms_per_step = loop_ms_per_step - compute_ms_per_step     (fastest of --repeats each)

The loop runs with each `--steps-per-loop` N given (updates per `tf.function` call,
batches read inside the graph; `TrainConfig.steps_per_loop`); `host_ms_per_step` is the
figure of the default N, `host_ms_per_step_by_n` has them all. Batches cycle through three
lengths (like length buckets), so the trace count shows whether the step is traced once
per run. Figures and the command: bench/README.md (log results/step_overhead_loop.log).

    PYTHONPATH=$PWD taskset -c 0 python bench/step_overhead.py --steps 600

Last line: JSON with host_ms_per_step (the default steps_per_loop's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfxformer  # noqa: E402
from tfxformer import training  # noqa: E402
from tfxformer.distribute import make_strategy  # noqa: E402
from tfxformer.models.transformer import Transformer  # noqa: E402
from tfxformer.schedules import paper_adam  # noqa: E402
from tfxformer.trainer import Trainer  # noqa: E402

VOCAB = 16
LENGTHS = (4, 8, 6)  # three "buckets"


def _batches(rows: int = 2) -> tf.data.Dataset:
    """An endless dataset of global batches cycling through LENGTHS."""
    rng = np.random.default_rng(0)
    data = None
    for length in LENGTHS:
        ids = rng.integers(4, VOCAB, (rows, length)).astype("int32")
        one = tf.data.Dataset.from_tensors(((ids, ids), ids))
        data = one if data is None else data.concatenate(one)
    return data.repeat()


class _NoSave:
    """Stands in for the checkpoint manager: the bench measures the loop, not the disk."""

    def save(self, step):
        return ""


def _trainer(strategy):
    with strategy.scope():
        model = Transformer(vocab_size=VOCAB, num_layers=1, d_model=8, num_heads=1, d_ff=16,
                            dropout=0.0)
        model.build()
        optimizer = paper_adam(1e-3)
    return Trainer(model, optimizer, strategy)


def _loop_ms(trainer, iterator, steps: int, log_every: int, start: int,
             steps_per_loop: int) -> float:
    """Wall ms per update of the real training loop from update `start`."""
    config = training.TrainConfig(model_dir=tempfile.mkdtemp(), train_steps=start + steps,
                                  log_every=log_every, checkpoint_every=10 ** 9,
                                  eval_every=0, steps_per_loop=steps_per_loop)
    began = time.perf_counter()
    training.train_loop(config, trainer, iterator, _NoSave(), tf.summary.create_noop_writer(),
                         start, lambda: {})
    return (time.perf_counter() - began) * 1000 / steps


def _compute_ms(trainer, iterator, steps: int) -> float:
    """ms per update of the same update repeated inside one tf.function."""
    feed = trainer.feed(iterator, depth=1)
    feed.fill(1)
    batches, step = feed.pop(), trainer.step

    @tf.function
    def repeat(n):
        for _ in tf.range(n):
            step(batches)
        return trainer.optimizer.iterations

    repeat(tf.constant(2)).numpy()  # trace and warm up
    began = time.perf_counter()
    repeat(tf.constant(steps)).numpy()
    return (time.perf_counter() - began) * 1000 / steps


def _code_label() -> str:
    """The git commit of the tfxformer measured, or its version outside a checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(tfxformer.__file__)))
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"tfxformer {tfxformer.__version__}"


def main(argv=None) -> int:
    default = training.setting("steps_per_loop").default
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="updates per timed run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (fastest)")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--steps-per-loop", default=f"1,{default}",
                        help=f"comma-separated updates per call to measure (default: 1 and "
                             f"TrainConfig's default, {default})")
    parser.add_argument("--label", default=None,
                        help="name of the code measured (default: its git commit)")
    args = parser.parse_args(argv)
    sizes = sorted({int(n) for n in args.steps_per_loop.split(",")} | {default})
    training.log.disabled = True  # the loop's INFO lines are not what is measured
    strategy = make_strategy(1)
    trainer = _trainer(strategy)
    iterator = iter(_batches())
    warm = 3 * len(LENGTHS)
    for n in sizes:  # traces happen here
        _loop_ms(trainer, iterator, warm, args.log_every, 0, n)
    loops, computes = {n: [] for n in sizes}, []
    for _ in range(args.repeats):  # interleaved, so all see the same machine load
        for n in sizes:
            loops[n].append(_loop_ms(trainer, iterator, args.steps, args.log_every,
                                     int(trainer.optimizer.iterations.numpy()), n))
        computes.append(_compute_ms(trainer, iterator, args.steps))
    # On a shared machine the fastest run is the least disturbed one: min - min.
    compute = min(computes)
    host = {n: round(min(loops[n]) - compute, 3) for n in sizes}
    result = {"bench": "step_overhead", "code": args.label or _code_label(),
        "steps": args.steps, "repeats": args.repeats, "statistic": "min over repeats",
        "log_every": args.log_every, "steps_per_loop": default,
        "lengths_cycled": list(LENGTHS), "loop_ms_per_step": round(min(loops[default]), 3),
        "loop_ms_all": {n: [round(x, 3) for x in loops[n]] for n in sizes},
        "compute_ms_per_step": round(compute, 3),
        "compute_ms_all": [round(x, 3) for x in computes],
        "step_traces_per_run": trainer.traces, "cores": os.cpu_count(),
        "loadavg_1min": round(os.getloadavg()[0], 2), "tensorflow": tf.__version__,
        "host_ms_per_step_median_pairs": round(statistics.median(
            a - b for a, b in zip(loops[default], computes, strict=True)), 3),
        "host_ms_per_step_by_n": host, "host_ms_per_step": host[default]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
