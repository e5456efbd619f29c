#!/usr/bin/env python
"""XLA on real text: beam search compiled with jit_compile (static cache) against the
graph the translator exports (growing cache, finished sentences leave the batch).

Conclusion: XLA does not pay on real text: the compiled static-cache search ran 0.45x the exported
graph on the shipped model (test_2016, batches of 64), because every sentence then stays
until the last is done; XLA is therefore not an export option.

The shipped EN->DE model's variables (saved_models/multi30k_en_de, highest version,
rebuilt as a Keras Transformer by tfxformer.serving.export.load_saved_model_weights; or
--model: another export or a trained run dir), the first --limit sentences of
test_2016_flickr.en tokenized with the run's SentencePiece model, sorted by length and cut
into batches of 64 as the translator does; each batch's source length is padded up to a
multiple of --bucket so that XLA compiles one program per bucket, not per length (the
last batch is filled up with EOS-only rows). Both decoders (beam 4, alpha 0.6) run every
batch once to compile/trace, then --repeats alternating passes; the script checks that
both give the same best hypotheses.

  python bench/studies/xla_real.py [--model DIR] [--limit 320] [--repeats 3]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.en")
SHIPPED = os.path.join(ROOT, "saved_models", "multi30k_en_de")


def batches(ids, batch_size, bucket):
    """Length-sorted (batch_size, S) int32 arrays (S a multiple of `bucket`) and the
    number of real rows in each."""
    import numpy as np

    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = []
    for start in range(0, len(ids), batch_size):
        rows = [ids[i] for i in order[start:start + batch_size]]
        width = -(-max(map(len, rows)) // bucket) * bucket
        array = np.zeros((batch_size, width), np.int32)
        array[:, 0] = 3  # filler rows: EOS only
        for j, row in enumerate(rows):
            array[j, :len(row)] = row
        out.append((array, len(rows)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=SHIPPED, help="SavedModel, export dir or run dir "
                    "(default: %(default)s)")
    ap.add_argument("--text", default=DATA, help="source sentences, one per line")
    ap.add_argument("--limit", type=int, default=320, help="first N sentences")
    ap.add_argument("--bucket", type=int, default=8, help="pad source lengths to a multiple")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per decoder")
    args = ap.parse_args(argv)

    import numpy as np
    import sentencepiece as spm
    import tensorflow as tf

    from tfxformer.decoding import beam_search

    bl.quiet_tf()
    path, model, _, spm_bytes = bl.load_trained(args.model)
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    with open(args.text, encoding="utf-8") as f:
        lines = f.read().splitlines()[:args.limit]
    work = batches([sp.encode(line)[:127] + [3] for line in lines], 64, args.bucket)

    def decoder(static):
        def run(src):
            return beam_search(model, src, beam_size=4, alpha=0.6, static_cache=static).ids[:, 0]
        return tf.function(run, jit_compile=static)

    systems = {"graph_growing_cache": decoder(False), "xla_static_cache": decoder(True)}

    def one_pass(fn):
        return [fn(tf.constant(array)).numpy()[:real] for array, real in work]

    first, times, outputs = {}, {name: [] for name in systems}, {}
    for name, fn in systems.items():
        first[name], _ = bl.timed(one_pass, fn)
        bl.log(f"{name}: first pass (trace/compile + run) {first[name]:.1f} s")
    for repeat in range(args.repeats):
        for name, fn in systems.items():
            seconds, outputs[name] = bl.timed(one_pass, fn)
            times[name].append(seconds)
            bl.log(f"{name} pass {repeat}: {seconds:.2f} s, {len(lines) / seconds:.1f} sent/s")
    same = sum(np.array_equal(a, b) for a, b in zip(*outputs.values(), strict=True))
    speed = {name: round(len(lines) / statistics.median(t), 1) for name, t in times.items()}
    bl.emit({"bench": "xla_real", "model": path, "sentences": len(lines),
             "batch_shapes": sorted({array.shape for array, _ in work}),
             "first_pass_s": {k: round(v, 1) for k, v in first.items()},
             "pass_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
             "sentences_per_second": speed,
             "xla_over_graph": round(speed["xla_static_cache"] / speed["graph_growing_cache"], 2),
             "identical_batches": f"{same}/{len(work)}", "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


if __name__ == "__main__":
    main()
