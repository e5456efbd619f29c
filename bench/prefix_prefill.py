"""A target prefix forced in one teacher-forced pass against one search step per prefix
token (`beam_search(..., prefill_prefix=True|False)`, :mod:`tfxformer.decoding.prefill`),
in one process on the same model, interleaved request by request.

    (uptime; PYTHONPATH=$PWD taskset -c 0 python bench/prefix_prefill.py \\
        --model saved_models/multi30k_en_de --single-limit 1000 --short 1,2,3; uptime) \\
        > bench/results/prefix_prefill.log 2>&1

The interactive case: the user typed the first words, the model completes. Sources are
Multi30k test_2016 (SentencePiece pieces, EOS, cut to the export's input limit); each
prefix is the first 25% or 50% of its reference's pieces (rounded, at least one). Beam
search with the export's beam size, α, extra length, output limit and rules, in a
`tf.function` per setting (traced once, warmed up). One sentence per request (batch 1:
latency p50/p95 per sentence, sentences/s) and batches of `--batch-size` in file order
(sentences/s, latency per batch); each request runs both settings back to back, which one
first alternating, so the machine's load falls on both alike; `time_ratio` is the median
of the requests' one-pass / step-by-step time ratios. With `--short 1,2,3` also prefixes
of exactly that many pieces at batch 1, the pass run from one column on (the package's
`MIN_COLUMNS` lowered to 1): what the threshold rests on.

Outputs: the n-best ids of the two settings compared request by request (`equal_ids`:
sentences whose whole n-best list is the same) and the largest score difference.
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


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def read(path, limit):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def padded(rows, pad=0):
    import numpy as np

    width = max(1, max(len(r) for r in rows))
    out = np.full([len(rows), width], pad, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def searches(model, decoding):
    """{name: tf.function (source (B, S), prefix (B, P) PAD after) -> (ids, scores)}:
    the one pass, step by step, and the one pass from one column on."""
    import tensorflow as tf

    from tfxformer.decoding import beam_search, prefill
    from tfxformer.decoding.steering import make_steering

    spec = [tf.TensorSpec([None, None], tf.int32)] * 2

    def make(prefill_prefix):
        @tf.function(input_signature=spec)
        def run(source, prefix):
            out = beam_search(model, source, decoding.beam_size, decoding.alpha,
                              decoding.extra_length, decoding.max_output_tokens,
                              stopping=decoding.stopping,
                              length_normalization=decoding.length_normalization,
                              steering=make_steering(tf.shape(source)[0], prefix=prefix),
                              prefill_prefix=prefill_prefix)
            return out.ids, out.scores
        return run

    fns = {"one_pass": make(True), "step_by_step": make(False)}
    warm = (tf.constant([[5, 6, 3]], tf.int32), tf.constant([[7, 8]], tf.int32))
    for fn in fns.values():
        fn(*warm)  # traced with the package's threshold
    saved, prefill.MIN_COLUMNS = prefill.MIN_COLUMNS, 1
    try:
        fns["one_pass_from_1"] = make(True)
        fns["one_pass_from_1"](*warm)
    finally:
        prefill.MIN_COLUMNS = saved
    return fns


def compare(fns, names, requests, order_seed=0):
    """Runs each request with `names` (two settings) back to back, alternating which
    first; ({name: [seconds]}, sentences with equal n-best ids, largest |score diff|)."""
    import numpy as np
    import tensorflow as tf

    times = {name: [] for name in names}
    equal, worst = 0, 0.0
    for r, (source, prefix) in enumerate(requests):
        source, prefix = tf.constant(source), tf.constant(prefix)
        outs = {}
        for name in (names if (r + order_seed) % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            ids, scores = fns[name](source, prefix)
            ids, scores = ids.numpy(), scores.numpy()
            times[name].append(time.perf_counter() - start)
            outs[name] = ids, scores
        (a_ids, a_scores), (b_ids, b_scores) = outs[names[0]], outs[names[1]]
        equal += int(np.sum(np.all(a_ids == b_ids, axis=(1, 2))))
        real = b_scores > -1e8
        if real.any():
            worst = max(worst, float(np.max(np.abs(a_scores[real] - b_scores[real]))))
    return times, equal, worst


def summary(times, sentences, per_request):
    """Sentences/s and latency p50/p95 of each setting; the median of the requests'
    time ratios, first setting / second."""
    first, second = times.values()
    out = {"time_ratio": round(statistics.median(a / b for a, b in zip(first, second,
                                                                        strict=True)), 3)}
    for name, seconds in times.items():
        row = {"sentences_per_s": round(sentences / sum(seconds), 2)}
        key = "latency_ms_per_sentence" if per_request == 1 else "latency_ms_per_batch"
        row[key] = {"p50": round(1000 * statistics.median(seconds), 1),
                    "p95": round(1000 * percentile(seconds, 95), 1)}
        out[name] = row
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="saved_models/multi30k_en_de",
                        help="a SavedModel export, run dir or preset dir (its weights, "
                             "vocabulary and decoding options)")
    parser.add_argument("--source", default=os.path.join(DATA, "test_2016_flickr.en"),
                        help="source sentences, one per line")
    parser.add_argument("--reference", default=os.path.join(DATA, "test_2016_flickr.de"),
                        help="their references, whose first pieces are the prefixes")
    parser.add_argument("--limit", type=int, default=1000, help="first N sentences")
    parser.add_argument("--single-limit", type=int, default=500,
                        help="of them, the first N sent one per request (batch 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="the batched requests")
    parser.add_argument("--batch-rounds", type=int, default=3,
                        help="passes over the batched requests (each pass interleaved)")
    parser.add_argument("--fractions", default="0.25,0.5",
                        help="prefix = this fraction of the reference's pieces")
    parser.add_argument("--short", default="",
                        help="also prefixes of exactly these numbers of pieces (e.g. 1,2,3) "
                             "at batch 1, the pass run from one column on")
    args = parser.parse_args(argv)

    import sentencepiece as spm

    from tfxformer import Transformer, pretrained
    from tfxformer.ids import EOS_ID

    model, record, spm_bytes = pretrained.load_source(Transformer, args.model, None, "fp32",
                                                      "bench/prefix_prefill.py")
    decoding = record.decoding
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    texts, references = read(args.source, args.limit), read(args.reference, args.limit)
    sources = [sp.encode(t)[:decoding.max_input_tokens - 1] + [EOS_ID] for t in texts]
    pieces = [sp.encode(r) for r in references]
    fns = searches(model, decoding)
    result = {"model": args.model, "sentences": len(texts), "decoding": {
        k: getattr(decoding, k) for k in ("beam_size", "alpha", "extra_length",
                                          "max_output_tokens", "stopping",
                                          "length_normalization")},
              "loadavg_start": os.getloadavg(), "settings": {}}
    log(f"load {os.getloadavg()}; {len(texts)} sentences")

    def prefixes(fraction):
        return [p[:max(1, int(fraction * len(p) + 0.5))] for p in pieces]

    fractions = [float(f) for f in args.fractions.split(",")]
    settings = [(f"{round(100 * f)}%", prefixes(f)) for f in fractions]
    shorts = [f"{n} pieces" for n in args.short.split(",") if n]
    settings += [(label, [p[:int(label.split()[0])] for p in pieces]) for label in shorts]
    pair = ["one_pass", "step_by_step"]
    for label, prefix in settings:
        n = args.single_limit
        single = [(padded([s]), padded([p])) for s, p in zip(sources[:n], prefix[:n],
                                                               strict=True)]
        names = ["one_pass_from_1", "step_by_step"] if label in shorts else pair
        compare(fns, names, single[:5])  # warm-up
        times, equal, worst = compare(fns, names, single)
        row = {"batch_1": summary(times, len(single), 1)}
        row["batch_1"].update(equal_ids=f"{equal}/{len(single)}", max_score_diff=worst,
                              mean_prefix_pieces=round(statistics.mean(
                                  len(p) for p in prefix[:n]), 2),
                              load=os.getloadavg())
        log(f"{label} batch 1: {json.dumps(row['batch_1'])}")
        if label not in shorts:
            size = args.batch_size
            batched = [(padded(sources[i:i + size]), padded(prefix[i:i + size]))
                       for i in range(0, len(sources), size)]
            compare(fns, pair, batched[:1])  # warm-up
            times, equal, worst = {name: [] for name in pair}, 0, 0.0
            for r in range(args.batch_rounds):
                t, e, w = compare(fns, pair, batched, order_seed=r)
                for name in pair:
                    times[name] += t[name]
                equal, worst = e, max(worst, w)
            rounds = args.batch_rounds
            row[f"batch_{size}"] = summary(times, rounds * len(sources), size)
            row[f"batch_{size}"].update(
                equal_ids=f"{equal}/{len(sources)}", max_score_diff=worst,
                mean_common_prefix_pieces=round(statistics.mean(
                    min(len(p) for p in prefix[i:i + size]) for i in range(
                        0, len(sources), size)), 2), load=os.getloadavg())
            log(f"{label} batch {size}: {json.dumps(row[f'batch_{size}'])}")
        result["settings"][label] = row
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
