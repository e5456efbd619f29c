#!/usr/bin/env python
"""Translation (decoding) throughput of tfxformer's beam search on the peers' workload.

The peers' workload (their RESULTS.md §3): base preset, random weights (seed 0), vocabulary
32000, 64 sources of 24 real tokens (default_rng(0).integers(3, V)), beam 4, α 0.6, the
whole call (encoder + search) `tfxformer.decoding.beam_search` in one tf.function. EOS is
an ordinary token (`eos_id=None`) and max_output_length = extra_length = --decode-steps, so
every sentence runs exactly --decode-steps tokens (checked).

--shortlist-size L decodes over a shortlist of L ids (`shortlist_ids(source, table)`, in
the timed call). A table of random data means nothing, so a stand-in of the same cost: every
source id's 50 entries come from one pool of L - 4 ids. Real L: bench/STUDIES.md.
--best is an alias of BEST below, the fastest of bench/README.md's table.

  python bench/decode_speed.py [--best]
  python bench/decode_speed.py --preset tiny --vocab-size 1000 --repeats 2   # smoke test

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics

import benchlib as bl
import flops

ALPHA = 0.6
SHORTLIST_PER_SOURCE = 50
# The mean shortlist length per batch of 64 newstest2014 sentences with the shipped model's
# table at K, N = 20, 1000 (vocabulary 8000; a 32k vocabulary's L is likely larger).
BEST_SHORTLIST_SIZE = 4547
BEST = {"precision": "bf16", "shortlist_size": BEST_SHORTLIST_SIZE}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bl.workload_args(ap, batch_size=64, src_len=24, tgt_len=None)
    ap.add_argument("--decode-steps", type=int, default=32,
                    help="tokens generated a sentence, EOS ignored (default: 32)")
    ap.add_argument("--beam-size", type=int, default=4, help="K beams (default: 4)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls after one warm-up")
    ap.add_argument("--shortlist-size", type=int, default=None, metavar="L",
                    help="decode over a vocabulary shortlist of L ids (4 <= L <= vocab), a "
                         "stand-in table of the same cost (see the module docstring) "
                         "(default: the full vocabulary)")
    ap.add_argument("--best", action="store_true",
                    help="the best mode: an alias of " + " ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in BEST.items())
                    + " (overrides those flags)")
    args = ap.parse_args(argv)
    if args.best:
        for name, value in BEST.items():
            setattr(args, name, value)
    if args.shortlist_size is not None and not 4 <= args.shortlist_size <= args.vocab_size:
        ap.error(f"--shortlist-size must be in [4, --vocab-size {args.vocab_size}], got "
                 f"{args.shortlist_size}.")
    return args


def build(args):
    import keras

    from tfxformer import Transformer

    bl.set_precision(args.precision)
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    return model


def source_ids(batch, src_len, vocab):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    return tf.constant(rng.integers(3, vocab, size=(batch, src_len)), tf.int32)


def stand_in_table(args):
    """(V, K) table whose entries all come from one pool of L - 4 ids (seed 0), or None:
    every batch's shortlist is then the pool and the special ids, L ids."""
    import numpy as np

    if args.shortlist_size is None:
        return None
    rng = np.random.default_rng(0)
    pool = bl.stand_in_pool(rng, args.vocab_size, args.shortlist_size)
    if pool.size == 0:
        return np.zeros([args.vocab_size, 1], np.int32)
    return rng.choice(pool, [args.vocab_size, SHORTLIST_PER_SOURCE]).astype(np.int32)


def make_decode_fn(model, args, steps, table=None):
    """tf.function(source ids -> (ids, lengths, shortlist length)): the public beam search,
    EOS disabled, over the batch's shortlist of `table` if given."""
    import tensorflow as tf

    from tfxformer.decoding import beam_search, shortlist_ids

    def run(src):
        shortlist = None if table is None else shortlist_ids(src, table)
        out = beam_search(model, src, beam_size=args.beam_size, alpha=ALPHA,
                          extra_length=steps, max_output_length=steps, eos_id=None,
                          shortlist=shortlist)
        size = tf.shape(shortlist)[0] if table is not None else tf.constant(-1)
        return out.ids, out.lengths, size

    return tf.function(run)


def time_calls(fn, src, repeats, steps):
    """First-call seconds, then `repeats` timed calls; checks every output length.
    Returns (first, times, ids shape, shortlist length or None)."""
    first, (ids, lengths, size) = bl.timed(lambda: [t.numpy() for t in fn(src)])
    if not (lengths == steps).all():
        raise RuntimeError(f"expected {steps} tokens per output, got lengths "
                           f"{sorted(set(lengths.ravel().tolist()))}")
    times = [bl.timed(lambda: [t.numpy() for t in fn(src)])[0] for _ in range(repeats)]
    return first, times, ids.shape, (None if size < 0 else int(size))


def run_calls(args, model, config, batch, src_len, steps):
    src = source_ids(batch, src_len, args.vocab_size)
    fn = make_decode_fn(model, args, steps, stand_in_table(args))
    first, times, shape, shortlist = time_calls(fn, src, args.repeats, steps)
    beams = args.beam_size
    med = statistics.median(times)
    kwargs = flops.model_flop_kwargs(config)
    if shortlist is not None:  # the output projection runs over the shortlist only
        kwargs["vocab"] = shortlist
    work = flops.decode_flops_cached(batch, src_len, steps, beams, **kwargs)
    return {
        "batch_size": batch, "src_len": src_len, "decode_steps": steps, "beams": beams,
        "shortlist_length": shortlist,
        "out_shape": list(shape), "first_call_s": round(first, 2), "repeats": len(times),
        "call_s": bl.spread(times),
        "sentences_per_second": round(batch / med, 2),
        "sentences_per_second_min_max": [round(batch / max(times), 2),
                                         round(batch / min(times), 2)],
        "target_tokens_per_second": round(batch * steps / med, 1),
        "sentences_per_second_best_call": round(batch / min(times), 2),
        "call_s_all": [round(t, 3) for t in times],
        "ms_per_decode_step": round(1e3 * med / steps, 2),
        "gflop_per_call": round(work / 1e9, 1),
        "gflop_per_s": round(work / med / 1e9, 1),
        "mfu": round(work / med / 1e9 / flops.PEAK_GFLOPS, 3),
    }


def main(argv=None):
    args = parse_args(argv)
    model = build(args)
    head = {"bench": "translate", "system": "tfxformer beam_search",
            "preset": args.preset, "vocab_size": args.vocab_size,
            "precision": args.precision, "best": BEST if args.best else None,
            "shortlist_size": args.shortlist_size, "alpha": ALPHA, "eos": "disabled",
            "peak_gflops_for_mfu": flops.PEAK_GFLOPS}
    result = {**head, "mode": "fixed",
              **run_calls(args, model, model.model_config.to_dict(), args.batch_size,
                          args.src_len, args.decode_steps)}
    bl.emit({**result, "peak_rss_mib": bl.peak_rss_mib(), **bl.machine()})


if __name__ == "__main__":
    main()
