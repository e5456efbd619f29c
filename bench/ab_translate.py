#!/usr/bin/env python
"""Same translations, and the time ratio, of the exported translator as tfxformer builds
it now and with a patch of bench/patches.py (what the search ran before a change).

Loads --model (a SavedModel export or version dir, a run dir) as a Keras Transformer,
builds one Translator (the export's tf.function: beam 4, the model's α unless --alpha)
with tfxformer as it is and one after `patches.apply(--patch)`, translates every line of
each --text file in batches of 64 with both, and reports how many translations are
identical (printing those that are not). With --repeats N the two then translate
everything N times more, alternating pass by pass, and the medians give the ratio.

  python bench/ab_translate.py --model saved_models/multi30k_en_de --patch layer_step \
      --text ../shared/data/multi30k/test_2016_flickr.en ../shared/data/multi30k/val.en
  python bench/ab_translate.py --patch plain_topk --repeats 3 \
      --text ../shared/data/multi30k/test_2016_flickr.en

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics

import benchlib as bl
import patches


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="saved_models/multi30k_en_de",
                    help="a SavedModel export or version dir, or a run dir")
    ap.add_argument("--text", nargs="+", required=True, help="source files, one per line")
    ap.add_argument("--patch", default="layer_step", choices=sorted(patches.PATCHES),
                    help="the variant to compare with (default: layer_step, the decoding "
                         "step through the Keras layers)")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=1.4, help="length penalty (default: "
                    "the shipped EN→DE model's 1.4)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=0,
                    help="timed passes over the text per variant, alternating (default 0)")
    return ap.parse_args(argv)


def translate_all(translator, lines, batch_size):
    import tensorflow as tf

    out = []
    for start in range(0, len(lines), batch_size):
        result = translator(tf.constant(lines[start:start + batch_size]))
        out += [t.decode("utf-8") for t in result["translation"].numpy()]
    return out


def main(argv=None):
    args = parse_args(argv)
    import tfxformer
    from tfxformer.data import Tokenizer
    from tfxformer.serving import Translator

    model = tfxformer.Transformer.from_preset(args.model)
    spm = Tokenizer.from_preset(args.model).spm_bytes
    lines = []
    for path in args.text:
        with open(path, encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in f]
    variants = ("now", args.patch)
    translators, results, first = {}, {}, {}
    for name in variants:
        if name == args.patch:
            patches.apply(args.patch)
        translators[name] = Translator(model, spm, beam_size=args.beam_size, alpha=args.alpha)
        first[name], results[name] = bl.timed(
            lambda t=translators[name]: translate_all(t, lines, args.batch_size))
        bl.log(f"{name}: {len(lines)} sentences in {first[name]:.1f} s (tracing included)")
    times = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name in variants:
            seconds, _ = bl.timed(lambda t=translators[name]: translate_all(
                t, lines, args.batch_size))
            times[name].append(seconds)
            bl.log(f"{name} pass {repeat}: {seconds:.2f} s, {len(lines) / seconds:.1f} sent/s")
    differ = [(a, b) for a, b in zip(*results.values(), strict=True) if a != b]
    for a, b in differ:
        bl.log(f"differs: now {a!r} | {args.patch} {b!r}")
    report = {"bench": "ab_translate", "model": args.model, "patch": args.patch,
              "sentences": len(lines), "identical": len(lines) - len(differ),
              "first_pass_s": {k: round(v, 1) for k, v in first.items()}}
    if args.repeats:
        speed = {k: round(len(lines) / statistics.median(v), 1) for k, v in times.items()}
        report.update(pass_s={k: [round(x, 2) for x in v] for k, v in times.items()},
                      sentences_per_second=speed,
                      now_over_patch=round(speed["now"] / speed[args.patch], 2))
    bl.emit({**report, "peak_rss_mib": bl.peak_rss_mib(), **bl.machine()})


if __name__ == "__main__":
    main()
