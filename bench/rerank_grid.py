"""N-best reranking on a tuning set: n-best lists, their scores, a grid over the weights,
and the paired bootstrap against the model's own output (docs/reranking.md).

    python bench/rerank_grid.py --model saved_models/multi30k_en_de \\
        --channel-model saved_models/multi30k_de_en --data ../shared/data/multi30k \\
        --set val --src en --tgt de --beam-sizes 4 8 12 --work runs/rerank/en_de

Steps, each cached in --work (rerun to add a beam size or a scorer): 1. the n-best list at
each beam size K (the export's search; Moses lines `val.kK.nbest`, as scripts/rerank.py
reads); 2. each candidate's scores (tfxformer.rerank; right_to_left with --r2l-model),
`val.kK.features.json`; 3. corpus BLEU for each weighting in the literature's Multi30k
metric (tfxformer.bleu.multi30k_bleu); 4. the best weighting against the beam-4 list's first
candidate (what the export translates): paired bootstrap (1,000 resamples), the spread of
the difference, and a 2-fold check (weights tuned on one half, scored on the other).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402,F401  (sets the log level before TensorFlow)


def nbest_lists(model_path, sources, beam_size, batch_size=32):
    """Per source, its `beam_size` hypotheses (text, score), best first, decoded with the
    export's options (alpha, stopping rule, length normalization, limits)."""
    import tensorflow as tf

    from tfxformer import Transformer, locate
    from tfxformer.decoding import beam_search
    from tfxformer.serving import Translator

    source = locate.resolve(model_path)
    options = source.record().decoding
    model = Transformer.from_preset(model_path)
    translator = Translator(model, source.spm_bytes, max_input_tokens=options.max_input_tokens,
                            max_output_tokens=options.max_output_tokens,
                            reverse_target=source.record().reverse_target)

    @tf.function(autograph=False)
    def decode(text):
        ids = translator.tokenize(text).to_tensor()
        out = beam_search(model, ids, beam_size=beam_size, alpha=options.alpha,
                          extra_length=options.extra_length,
                          max_output_length=translator.max_output_tokens,
                          stopping=options.stopping,
                          length_normalization=options.length_normalization)
        shape = tf.shape(out.ids)
        flat = translator.detokenize(tf.reshape(out.ids, [-1, shape[2]]),
                                     tf.reshape(out.lengths, [-1]))
        return tf.reshape(flat, shape[:2]), out.scores

    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    lists = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        texts, scores = decode(tf.constant([sources[i] for i in rows]))
        for i, row_t, row_s in zip(rows, texts.numpy(), scores.numpy(), strict=True):
            lists[i] = [(t.decode("utf-8"), float(s)) for t, s in zip(row_t, row_s,
                                                                        strict=True)
                        if s > -1e8]
    return lists, options


def write_nbest(path, lists):
    with open(path, "w", encoding="utf-8") as f:
        for i, row in enumerate(lists):
            for text, score in row:
                f.write(f"{i} ||| {' '.join(text.split())} ||| {score:.6f}\n")


def features_for(lists, sources, args, cached):
    """The scores of `lists` (tfxformer.rerank.score_features), those in `cached` kept."""
    from tfxformer import rerank
    from tfxformer.serving import load_score_fn

    wanted = {"forward": rerank.forward_score, "length": rerank.length_score,
              "mbr_bleu": lambda: rerank.mbr_score("bleu"),
              "mbr_chrf": lambda: rerank.mbr_score("chrf")}
    models = {"forward_model": (args.model, "forward"),
              "channel": (args.channel_model, "channel"),
              "right_to_left": (args.r2l_model, "forward")}
    loaded = {}
    for name, (path, direction) in models.items():
        if path is None:
            continue
        for mean in (False, True):
            key = name + ("_mean" if mean else "")

            def make(path=path, direction=direction, mean=mean):
                if path not in loaded:
                    loaded[path] = load_score_fn(path, batch_size=64)
                return rerank.model_score(loaded[path], direction, mean)
            wanted[key] = make
    features = dict(cached)
    for name, make in wanted.items():
        if name in features:
            continue
        began = time.time()
        features.update(rerank.score_features(lists, sources, {name: make()}))
        print(f"# scored {name} in {time.time() - began:.0f} s", flush=True)
    return features


class Grader:
    """Corpus BLEU of a choice of candidates, in the Multi30k metric (each candidate
    tokenized once)."""

    def __init__(self, lists, references, tgt):
        from tfxformer.bleu import multi30k_tokenize

        flat = [text for row in lists for text, _ in row]
        tokenized = iter(multi30k_tokenize(flat, tgt))
        self.tokenized = [[next(tokenized) for _ in row] for row in lists]
        self.references = references

    def hypotheses(self, index, rows=None):
        rows = range(len(self.tokenized)) if rows is None else rows
        return [self.tokenized[i][index[i]] if index[i] >= 0 else "" for i in rows]

    def bleu(self, index, rows=None):
        import sacrebleu

        rows = range(len(self.tokenized)) if rows is None else rows
        refs = [self.references[i] for i in rows]
        return sacrebleu.corpus_bleu(self.hypotheses(index, rows), [refs], tokenize="none",
                                     force=True).score


def grid(features):
    """The weightings tried: (label, weights)."""
    out = [("forward (the model's output)", {"forward": 1.0})]
    length = (-0.1, -0.05, 0.0, 0.05, 0.1)
    for name, values in (("channel", (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
                         ("channel_mean", (0.1, 0.2, 0.5, 1.0, 2.0)),
                         ("right_to_left", (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
                         ("right_to_left_mean", (0.2, 0.5, 1.0, 2.0))):
        if name in features:
            for value, words in itertools.product(values, length):
                weights = {"forward": 1.0, name: value, "length": words}
                out.append((f"forward + {value:g} {name} + {words:g} length", weights))
    for words in length:
        if words:
            out.append((f"forward + {words:g} length", {"forward": 1.0, "length": words}))
    for name in ("forward_model", "forward_model_mean"):
        if name in features:
            out.append((name, {name: 1.0}))
    for utility in ("mbr_bleu", "mbr_chrf"):
        out.append((f"{utility} alone", {utility: 1.0}))
        for value in (0.5, 1.0, 2.0, 5.0, 10.0):
            out.append((f"{utility} + {value:g} forward", {utility: 1.0, "forward": value}))
        for value in (0.2, 0.5, 1.0, 2.0):
            out.append((f"{utility} + {value:g} channel", {utility: 1.0, "channel": value}))
            out.append((f"{utility} + {value:g} forward + {value:g} channel",
                        {utility: 1.0, "forward": value, "channel": value}))
    if "right_to_left" in features and "channel" in features:
        for c, r in itertools.product((0.02, 0.05, 0.1, 0.2), (0.02, 0.05, 0.1, 0.2)):
            out.append((f"forward + {c:g} channel + {r:g} right_to_left",
                        {"forward": 1.0, "channel": c, "right_to_left": r}))
    return [(label, w) for label, w in out if set(w) <= set(features)]


def bootstrap(baseline, chosen, references, samples=1000):
    """sacreBLEU's paired bootstrap of the hypotheses `chosen` against `baseline`
    (tokenized): the p-value, and each system's mean and 95% interval over the resamples."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("baseline", baseline), ("reranked", chosen)],
                      {"BLEU": BLEU(tokenize="none", force=True)}, [references],
                      test_type="bs", n_samples=samples)
    _, results = test()
    base, other = results["BLEU"]
    return {"p_value": other.p_value, "baseline_mean": base.mean, "baseline_ci": base.ci,
            "reranked_mean": other.mean, "reranked_ci": other.ci}


def paired_delta(baseline, chosen, references, samples=1000, seed=12345):
    """The BLEU difference `chosen` - `baseline` (tokenized hypotheses) and its spread over
    `samples` bootstrap resamples of the sentences: (difference, sd, 2.5 and 97.5
    percentiles, share of resamples where it is <= 0)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize="none", force=True)

    def statistics(hypotheses):
        return np.array([metric._extract_corpus_statistics([h], [[r]])[0]
                         for h, r in zip(hypotheses, references, strict=True)])

    def bleu(rows):
        return metric._compute_score_from_stats(list(rows.sum(0))).score

    base, other = statistics(baseline), statistics(chosen)
    draws = np.random.default_rng(seed).integers(0, len(references),
                                                 size=(samples, len(references)))
    deltas = np.array([bleu(other[d]) - bleu(base[d]) for d in draws])
    return (bleu(other) - bleu(base), deltas.std(), np.percentile(deltas, 2.5),
            np.percentile(deltas, 97.5), float(np.mean(deltas <= 0)))


def two_fold(features, grader, weightings, size):
    """Weights tuned on one half of the set (even / odd lines), scored on the other: the
    gain over forward on held-out halves, summed as a whole-set BLEU of the two halves."""
    from tfxformer.rerank import combine

    halves = [list(range(0, size, 2)), list(range(1, size, 2))]
    chosen = [0] * size
    picks = []
    for tune, test in (halves, halves[::-1]):
        best = max(weightings, key=lambda lw: grader.bleu(combine(
            features, lw[1])[0], tune))
        index = combine(features, best[1])[0]
        for i in test:
            chosen[i] = index[i]
        picks.append(best[0])
    return grader.bleu(chosen), picks


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the forward model (SavedModel)")
    parser.add_argument("--channel-model", help="the backward model (SavedModel or run dir)")
    parser.add_argument("--r2l-model", help="the right-to-left model (SavedModel or run dir)")
    parser.add_argument("--data", required=True, help="folder of SET.SRC / SET.TGT and tok/")
    parser.add_argument("--set", default="val", help="the tuning set (default: val)")
    parser.add_argument("--src", default="en", help="source suffix (default: en)")
    parser.add_argument("--tgt", default="de", help="target suffix (default: de)")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[4, 8, 12],
                        help="n-best list sizes K (default: 4 8 12)")
    parser.add_argument("--work", required=True, help="cache folder (n-best lists, scores)")
    parser.add_argument("--top", type=int, default=15, help="grid rows printed per beam size")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    from tfxformer.rerank import combine

    def lines(path):
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    sources = lines(os.path.join(args.data, f"{args.set}.{args.src}"))
    references = lines(os.path.join(args.data, "tok", f"{args.set}.lc.norm.tok.{args.tgt}"))
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_cpu_model()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"# {' '.join(sys.argv)}")
    baseline = None
    for beam_size in args.beam_sizes:
        stem = os.path.join(args.work, f"{args.set}.k{beam_size}")
        if os.path.exists(stem + ".lists.json"):
            with open(stem + ".lists.json", encoding="utf-8") as f:
                lists = json.load(f)
        else:
            began = time.time()
            lists, options = nbest_lists(args.model, sources, beam_size)
            print(f"# beam {beam_size}: n-best lists of {len(sources)} sources in "
                  f"{time.time() - began:.0f} s (alpha {options.alpha}, stopping "
                  f"{options.stopping})", flush=True)
            write_nbest(stem + ".nbest", lists)
            with open(stem + ".lists.json", "w", encoding="utf-8") as f:
                json.dump(lists, f, ensure_ascii=False)
        cached = {}
        if os.path.exists(stem + ".features.json"):
            with open(stem + ".features.json", encoding="utf-8") as f:
                cached = json.load(f)
        features = features_for(lists, sources, args, cached)
        with open(stem + ".features.json", "w", encoding="utf-8") as f:
            json.dump(features, f)
        grader = Grader(lists, references, args.tgt)
        first = [0 if row else -1 for row in lists]
        if baseline is None:
            baseline = (beam_size, first, grader)
        rows = []
        weightings = grid(features)
        for label, weights in weightings:
            rows.append((grader.bleu(combine(features, weights)[0]), label, weights))
        rows.sort(key=lambda r: -r[0])
        print(f"\n## beam {beam_size}: {len(weightings)} weightings, {args.set} multi30k BLEU")
        print(f"forward (the first candidate): {grader.bleu(first):.2f}; oracle (best "
              "sentence-BLEU candidate): "
              f"{grader.bleu(_oracle(grader, references)):.2f}")
        for score, label, _ in rows[:args.top]:
            print(f"{score:6.2f}  {label}")
        for prefix in ("mbr_bleu alone", "mbr_chrf alone"):
            print(f"{next(r[0] for r in rows if r[1] == prefix):6.2f}  {prefix}")
        best = rows[0]
        index = combine(features, best[2])[0]
        base_k, base_first, base_grader = baseline
        test = bootstrap(base_grader.hypotheses(base_first), grader.hypotheses(index),
                         references)
        delta = paired_delta(base_grader.hypotheses(base_first), grader.hypotheses(index),
                             references)
        held_out, picks = two_fold(features, grader, weightings, len(sources))
        print(f"best: {best[1]} {best[0]:.2f} against the model's output (beam {base_k}) "
              f"{base_grader.bleu(base_first):.2f}: paired bootstrap p = "
              f"{test['p_value']:.4f}, baseline {test['baseline_mean']:.2f} ± "
              f"{test['baseline_ci']:.2f}, reranked {test['reranked_mean']:.2f} ± "
              f"{test['reranked_ci']:.2f} (95%); the difference {delta[0]:+.2f}, bootstrap "
              f"sd {delta[1]:.2f}, 95% [{delta[2]:+.2f}, {delta[3]:+.2f}], <= 0 in "
              f"{delta[4]:.1%} of the resamples; 2-fold held-out {held_out:.2f} "
              f"(picked: {picks[0]} | {picks[1]})", flush=True)


def _oracle(grader, references):
    import sacrebleu

    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True, effective_order=True)
    return [max(range(len(row)), key=lambda k: metric.sentence_score(row[k], [ref]).score)
            if row else -1 for row, ref in zip(grader.tokenized, references, strict=True)]


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


if __name__ == "__main__":
    main()
