#!/usr/bin/env python
"""Same translations from both decoding steps: the lean step (the default) and the Keras
layers' step (`--patch layer_step`), on a trained model and real sentences.

Loads --model (a SavedModel export or version dir, a run dir) as a Keras Transformer,
builds one Translator (beam 4, the model's α unless --alpha) with the lean step and one
with the layers' step, translates every line of each --text file in batches of 64 with
both, and reports how many translations are identical (and prints those that are not).

  python bench/lean_step.py --model saved_models/multi30k_en_de \
      --text ../shared/data/multi30k/test_2016_flickr.en ../shared/data/multi30k/val.en

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json

import benchlib as bl
import patches


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="saved_models/multi30k_en_de",
                    help="a SavedModel export or version dir, or a run dir")
    ap.add_argument("--text", nargs="+", required=True, help="source files, one per line")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=1.4, help="length penalty (default: "
                    "the shipped EN→DE model's 1.4)")
    ap.add_argument("--batch-size", type=int, default=64)
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
    results, seconds = {}, {}
    for step in ("lean", "layers"):
        if step == "layers":
            patches.apply("layer_step")
        translator = Translator(model, spm, beam_size=args.beam_size, alpha=args.alpha)
        seconds[step], results[step] = bl.timed(
            lambda t=translator: translate_all(t, lines, args.batch_size))
        bl.log(f"{step}: {len(lines)} sentences in {seconds[step]:.1f} s (tracing included)")
    differ = [(a, b) for a, b in zip(results["lean"], results["layers"], strict=True) if a != b]
    for a, b in differ:
        bl.log(f"differs: lean {a!r} | layers {b!r}")
    print(json.dumps({"model": args.model, "sentences": len(lines),
                      "identical": len(lines) - len(differ), "seconds": seconds}))


if __name__ == "__main__":
    main()
