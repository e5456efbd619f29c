"""The cost of per-token log-probabilities in `translate_nbest` (docs/steering.md): its
graph with them (the signature's) against the same graph without them
(`Translator.nbest(..., token_scores=False)`), in one process on the same model.

    PYTHONPATH=$PWD python bench/token_log_probs.py --model saved_models/multi30k_en_de \\
        --limit 200 --repeats 7 > bench/results/token_log_probs.log 2>&1

Sentences/s of the n-best lists (`--num-hypotheses` of the export's beam, its α and extra
length, batches of `--batch-size` in file order), each setting warmed up by a whole pass,
then timed in turn for `--repeats` rounds, every other round in reverse order; the ratio
of the two passes' times round by round (their median), and whether both give the same
translations and scores. Result JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data", "multi30k")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a SavedModel export dir or version")
    parser.add_argument("--source", default=os.path.join(DATA, "test_2016_flickr.en"),
                        help="source sentences, one per line")
    parser.add_argument("--limit", type=int, default=200, help="first N sentences")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per request")
    parser.add_argument("--num-hypotheses", type=int, default=4, help="list length")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from tfxformer import Transformer, pretrained
    from tfxformer.serving import Translator

    model, record, spm_bytes = pretrained.load_source(Transformer, args.model, None, "fp32",
                                                      "bench/token_log_probs.py")
    d = record.decoding
    translator = Translator(model, spm_bytes, beam_size=d.beam_size, alpha=d.alpha,
                            extra_length=d.extra_length, max_batch_size=args.batch_size,
                            max_input_tokens=d.max_input_tokens,
                            max_output_tokens=d.max_output_tokens, stopping=d.stopping,
                            length_normalization=d.length_normalization)
    with open(args.source, encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f][:args.limit]

    def fn(token_scores):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def run(text):
            n = tf.size(text)
            return translator.nbest(text, tf.fill([n], d.beam_size), tf.fill([n], d.alpha),
                                    tf.fill([n], d.extra_length),
                                    tf.fill([n], d.max_input_tokens),
                                    tf.fill([n], args.num_hypotheses),
                                    token_scores=token_scores)
        return run

    settings = {"without": fn(False), "with": fn(True)}

    def one_pass(run):
        start, outs = time.perf_counter(), []
        for i in range(0, len(texts), args.batch_size):
            outs.append(run(tf.constant(texts[i:i + args.batch_size])))
        return time.perf_counter() - start, outs

    outputs = {name: one_pass(run)[1] for name, run in settings.items()}  # warm-up
    same = all(tf.reduce_all(a[key] == b[key]).numpy()
               for a, b in zip(outputs["without"], outputs["with"], strict=True)
               for key in ("translations", "scores"))
    times = {name: [] for name in settings}
    for r in range(args.repeats):
        for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
            times[name].append(one_pass(settings[name])[0])
        print(f"round {r}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
              file=sys.stderr)
    ratios = [w / o for w, o in zip(times["with"], times["without"], strict=True)]
    result = {"model": args.model, "sentences": len(texts), "batch_size": args.batch_size,
              "num_hypotheses": args.num_hypotheses, "repeats": args.repeats,
              "sentences_per_s": {n: round(len(texts) / statistics.median(t), 2)
                                  for n, t in times.items()},
              "time_ratio_with_to_without": {"median": round(statistics.median(ratios), 3),
                                             "min": round(min(ratios), 3),
                                             "max": round(max(ratios), 3)},
              "same_translations_and_scores": bool(same),
              "load_average": os.getloadavg()}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
