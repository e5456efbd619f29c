#!/usr/bin/env python
"""One long input among short ones: does a decoding step cost what the running sentences
cost? ("Finished sentences leave the batch".)

Conclusion: finished sentences leave the batch: 63 short sources + 1 long one cost 1.12x
(beam 4) and 0.94x (greedy) the short ones padded alike plus the long one alone, against
3.65x and 1.72x when every sentence ran until the last was done
(bench/results/decode_compaction.log).

Random-weight model (--preset, seed 0), sources of real tokens (numpy default_rng(0)),
EOS kept (real decoding; with random weights nearly every sentence runs to its limit,
source length + --extra-length, §6.1). Three batches through the public decoders
(`beam_search` / `greedy_decode`, growing cache, each inside one tf.function):

  mixed         --short-count short sources (--short-len tokens) + 1 long one (--long-len)
  short         the short sources alone
  short_padded  the short sources padded to the long one's length (the source shape of
                `mixed`: its encoder and cross-attention cost, without the long sentence)
  long          the long source alone

If finished sentences keep paying for every step, `mixed` costs about
(long-len + extra) / (short-len + extra) times `short_padded`; if they leave the batch,
about `short_padded` + `long`. The JSON reports the medians and `mixed_over_short`,
`mixed_over_short_padded_plus_long`. Runs on older tfxformer trees too (positional arguments
only), so the same command measures before and after:

  python bench/studies/decode_compaction.py                  # small preset, beam 4 + greedy
  PYTHONPATH=OLD_TREE python bench/studies/decode_compaction.py   # an older tfxformer
  python bench/studies/decode_compaction.py --preset tiny --vocab-size 1000 --long-len 40 \
      --repeats 1

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--short-count", type=int, default=63)
    ap.add_argument("--short-len", type=int, default=12, help="tokens, EOS included")
    ap.add_argument("--long-len", type=int, default=200, help="tokens, EOS included")
    ap.add_argument("--extra-length", type=int, default=50)
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--modes", default="beam,greedy")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up")
    return ap.parse_args(argv)


def sources(args):
    """{"mixed", "short", "short_padded", "long"}: (B, S) int32 batches (ids, EOS, PAD)."""
    import numpy as np
    import tensorflow as tf

    from tfxformer.ids import EOS_ID, NUM_SPECIAL_IDS

    rng = np.random.default_rng(0)
    lengths = [args.short_len] * args.short_count + [args.long_len]
    rows = np.zeros((len(lengths), max(lengths)), np.int32)
    for b, n in enumerate(lengths):
        rows[b, :n - 1] = rng.integers(NUM_SPECIAL_IDS, args.vocab_size, n - 1)
        rows[b, n - 1] = EOS_ID
    short = rows[:-1, :args.short_len]
    return {"mixed": tf.constant(rows), "short": tf.constant(short),
            "short_padded": tf.constant(rows[:-1]), "long": tf.constant(rows[-1:])}


def decode_fn(model, args, mode):
    import tensorflow as tf

    from tfxformer.decoding import beam_search, greedy_decode

    def run(src):
        if mode == "greedy":
            out = greedy_decode(model, src, args.extra_length)
            return out.ids, out.lengths
        out = beam_search(model, src, args.beam_size, 0.6, args.extra_length)
        return out.ids, out.lengths

    return tf.function(run, reduce_retracing=True)


def measure(model, args, mode, batches):
    """Median seconds per batch kind; each kind traced and warmed up first."""
    fn = decode_fn(model, args, mode)
    lengths = {}
    for name, src in batches.items():
        lengths[name] = fn(src)[1].numpy()
    times = {name: [] for name in batches}
    for _ in range(args.repeats):  # interleaved, so a load change hits every kind alike
        for name, src in batches.items():
            times[name].append(bl.timed(lambda s=src: [t.numpy() for t in fn(s)])[0])
    med = {name: statistics.median(t) for name, t in times.items()}
    longest = lambda v: int(v.max()) if v.size else 0
    row = {"mode": mode, "call_s": {n: bl.spread(t) for n, t in times.items()},
           "output_tokens_max": {n: longest(v) for n, v in lengths.items()},
           "mixed_over_short": round(med["mixed"] / med["short"], 3),
           "mixed_over_short_padded_plus_long": round(
               med["mixed"] / (med["short_padded"] + med["long"]), 3)}
    bl.log(f"{mode}: " + ", ".join(f"{n} {v:.3f} s" for n, v in med.items())
           + f"; mixed / short x{row['mixed_over_short']}, mixed / (short_padded + long) "
           f"x{row['mixed_over_short_padded_plus_long']}")
    return row


def main(argv=None):
    args = parse_args(argv)
    import keras

    import tfxformer
    from tfxformer import Transformer

    bl.set_precision("fp32")
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    batches = sources(args)
    rows = [measure(model, args, mode, batches) for mode in args.modes.split(",")]
    bl.emit({"bench": "decode_compaction", "tfxformer": tfxformer.__file__,
             "preset": args.preset, "vocab_size": args.vocab_size,
             "short": [args.short_count, args.short_len], "long_len": args.long_len,
             "extra_length": args.extra_length, "beam_size": args.beam_size,
             "repeats": args.repeats, "rows": rows, "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


if __name__ == "__main__":
    main()
