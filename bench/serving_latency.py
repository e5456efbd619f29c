"""Serving latency of an exported translator, each figure from a fresh process.

Loads the SavedModel with the session-based loader TF Serving uses
(`tf.compat.v1.saved_model.loader.load` in a `tf.compat.v1.Session`, tensorflow-text's
ops registered) and prints one JSON line per measurement:

- `cold`: load time; the first `serving_default` request (64 `test_2016_flickr`
  sentences, and 1 sentence) after load, with the warm-up records of
  `assets.extra/tf_serving_warmup_requests` replayed first (as TF Serving does) or not;
  the median warm request; peak RSS of the process.
- `long`: 63 normal sentences alone against the same 63 plus one 10,000-character input
  (real sentences joined into one line), warm, medians.

    python bench/serving_latency.py --model saved_models/multi30k_en_de \
        --data ../shared/data/multi30k [--what cold long] [--repeats 3]

Not run by the test suite. Rerun after decoding changes: `long` is what compaction of
finished sentences improves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LONG_CHARS = 10_000


def _sentences(data, count, skip=0):
    with open(os.path.join(data, "test_2016_flickr.en"), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[skip:skip + count]


def _long_input(data):
    text = " ".join(_sentences(data, 1000, skip=100))
    return text[:LONG_CHARS]


class _Session:
    """A SavedModel in a tf.compat.v1.Session, run by signature as TF Serving runs it."""

    def __init__(self, path):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401 (registers the SentencePiece ops)

        self.tf = tf
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            self.meta = tf.compat.v1.saved_model.loader.load(self.session, ["serve"], path)

    def run(self, signature, inputs):
        sig = self.meta.signature_def[signature or "serving_default"]
        keys = sorted(sig.outputs)
        values = self.session.run([sig.outputs[k].name for k in keys],
                                  {sig.inputs[k].name: v for k, v in inputs.items()})
        return dict(zip(keys, values, strict=True))

    def replay_warmup(self, path):
        """Runs every warm-up record through the signature it names; returns the count."""
        from tensorflow_serving.apis import prediction_log_pb2

        warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
        if not os.path.exists(warmup):
            return 0
        count = 0
        for raw in self.tf.compat.v1.io.tf_record_iterator(warmup):
            log = prediction_log_pb2.PredictionLog()
            log.ParseFromString(raw)
            request = log.predict_log.request
            self.run(request.model_spec.signature_name,
                     {k: self.tf.make_ndarray(v) for k, v in request.inputs.items()})
            count += 1
        return count


def _timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def child_cold(args):
    """One fresh process: load, maybe warm up, first request, warm requests."""
    import numpy as np

    start = time.perf_counter()
    server = _Session(args.model)
    load_s = time.perf_counter() - start
    warmup_s, records = 0.0, 0
    if args.warmup:
        start = time.perf_counter()
        records = server.replay_warmup(args.model)
        warmup_s = time.perf_counter() - start
    texts = np.array(_sentences(args.data, args.batch), dtype=object)
    request = lambda: server.run("serving_default", {"text": texts})  # noqa: E731
    first_s = _timed(request)
    warm_s = statistics.median(_timed(request) for _ in range(args.repeats))
    print(json.dumps({
        "measure": "cold", "model": args.model, "warmup": args.warmup,
        "warmup_records": records, "batch": args.batch, "load_s": round(load_s, 3),
        "warmup_s": round(warmup_s, 3), "first_request_s": round(first_s, 3),
        "warm_request_s": round(warm_s, 3), "first_over_warm": round(first_s / warm_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def child_long(args):
    """One fresh process: 63 sentences alone vs 63 + one 10,000-character input."""
    import numpy as np

    server = _Session(args.model)
    server.replay_warmup(args.model)
    normal = _sentences(args.data, 63)
    batches = {"normal_63": normal, "normal_63_plus_long": normal + [_long_input(args.data)]}
    times, truncated = {}, None
    for name, texts in batches.items():
        inputs = {"text": np.array(texts, dtype=object)}
        out = server.run("serving_default", inputs)  # warm this batch shape
        if "truncated" in out:
            truncated = bool(out["truncated"][-1])
        times[name] = statistics.median(_timed(lambda i=inputs: server.run(
            "serving_default", i)) for _ in range(args.repeats))
    print(json.dumps({
        "measure": "long", "model": args.model, "long_chars": LONG_CHARS,
        "long_truncated": truncated, **{f"{k}_s": round(v, 3) for k, v in times.items()},
        "ratio": round(times["normal_63_plus_long"] / times["normal_63"], 2)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="SavedModel version dir")
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "multi30k"),
                        help="Multi30k dir with test_2016_flickr.en (default: %(default)s)")
    parser.add_argument("--what", nargs="+", choices=["cold", "long"], default=["cold", "long"],
                        help="measurements to run (default: both)")
    parser.add_argument("--repeats", type=int, default=3, help="warm requests timed (median)")
    parser.add_argument("--child", choices=["cold", "long"], help=argparse.SUPPRESS)
    parser.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return (child_cold if args.child == "cold" else child_long)(args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    common = [sys.executable, __file__, "--model", args.model, "--data", args.data,
              "--repeats", str(args.repeats)]
    runs = []
    if "cold" in args.what:
        runs += [[*common, "--child", "cold", "--batch", str(batch), *warm]
                 for batch in (64, 1) for warm in (["--warmup"], [])]
    if "long" in args.what:
        runs.append([*common, "--child", "long"])
    for command in runs:
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode:
            sys.stderr.write(result.stderr[-3000:])
            return result.returncode
        print(result.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
