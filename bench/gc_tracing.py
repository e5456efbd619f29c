"""CPU seconds of exporting the tiny preset (every signature traced and saved) in one
process, alternating Python's default garbage-collector thresholds (700, 10, 10) with the
test processes' (tests/docs_fork.py `collect_less_often`: imports frozen, (100000, 50,
1000)); the first pair warms up and is not counted.

  taskset -c 0 python bench/gc_tracing.py --pairs 5 > bench/results/gc_tracing.log
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_serving import train_sentencepiece  # noqa: E402

from tfxformer import Transformer  # noqa: E402
from tfxformer.serving import Translator, export_translator  # noqa: E402

THRESHOLDS = {"default": (700, 10, 10), "less_often": (100_000, 50, 1000)}


def export_seconds(spm, folder):
    start = time.process_time()
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=48)
    translator = Translator(model, spm, beam_size=3, extra_length=4, max_batch_size=3)
    shutil.rmtree(folder, ignore_errors=True)
    export_translator(translator, folder, config={"src": "en", "tgt": "de"})
    return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="exports per setting, +1 warm-up")
    args = parser.parse_args(argv)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})  # as tests
    spm = train_sentencepiece()
    gc.collect()
    gc.freeze()
    seconds = {name: [] for name in THRESHOLDS}
    with tempfile.TemporaryDirectory() as work:
        for pair in range(args.pairs + 1):
            for name, threshold in THRESHOLDS.items():
                gc.set_threshold(*threshold)
                spent = export_seconds(spm, os.path.join(work, name))
                if pair:
                    seconds[name].append(round(spent, 2))
    print(json.dumps({"cpu_seconds": seconds, "median": {
        name: statistics.median(values) for name, values in seconds.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
