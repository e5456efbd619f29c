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

--stopping-steps compares beam search's two stopping rules instead of a patch
(`stopping`, tfxformer.decoding.beam_search): each --text file is decoded under "bound"
and "finished" (--beam-size, --alpha; the export's extra length and token limits;
sources sorted by length in batches of --batch-size), recording per sentence the step it
left the batch (`BeamSearchOutput.steps`) and its output length (tokens, EOS included),
and scored with cased sacreBLEU against --refs. With --repeats N the exported translator
with each rule also translates everything N times, alternating: sentences/s.

  python bench/ab_translate.py --stopping-steps --repeats 1 \
      --text ../shared/data/multi30k/test_2016_flickr.en \
      --refs ../shared/data/multi30k/test_2016_flickr.de
  python bench/ab_translate.py --stopping-steps --limit 500 \
      --text ../shared/data/wmt14/newstest2014.en --refs ../shared/data/wmt14/newstest2014.de

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
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
    ap.add_argument("--beam-size", type=int, default=4,
                    help="beam size of every variant (default: %(default)s)")
    ap.add_argument("--alpha", type=float, default=1.4, help="length penalty (default: "
                    "the shipped EN→DE model's 1.4)")
    ap.add_argument("--batch-size", type=int, default=64,
                    help="sentences per translation call (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="timed passes over the text per variant, alternating (default 0)")
    ap.add_argument("--stopping-steps", action="store_true",
                    help="compare the stopping rules bound and finished instead of a "
                         "--patch: per sentence the step it left the batch, mean steps "
                         "against mean output length, BLEU against --refs")
    ap.add_argument("--refs", nargs="+",
                    help="with --stopping-steps: a reference file per --text file")
    ap.add_argument("--limit", type=int,
                    help="only the first N lines of each --text (and --refs) file")
    ap.add_argument("--length-normalization", choices=("gnmt", "length"), default="gnmt",
                    help="with --stopping-steps: the normalization both rules run with "
                         "(default: %(default)s)")
    ap.add_argument("--steps-file",
                    help="with --stopping-steps: write one JSON line per sentence (set, "
                         "line, limit, and per rule its steps and output tokens)")
    args = ap.parse_args(argv)
    if args.stopping_steps and len(args.refs or ()) != len(args.text):
        ap.error(f"--stopping-steps needs one --refs file per --text file: {len(args.text)} "
                 f"--text, {len(args.refs or ())} --refs")
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}")
    return args


def read_lines(path, limit=None):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def translate_all(translator, lines, batch_size):
    import tensorflow as tf

    out = []
    for start in range(0, len(lines), batch_size):
        result = translator(tf.constant(lines[start:start + batch_size]))
        out += [t.decode("utf-8") for t in result["translation"].numpy()]
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.stopping_steps:
        return stopping_steps(args)
    import tfxformer
    from tfxformer.data import Tokenizer
    from tfxformer.serving import Translator

    model = tfxformer.Transformer.from_preset(args.model)
    spm = Tokenizer.from_preset(args.model).spm_bytes
    lines = [line for path in args.text for line in read_lines(path, args.limit)]
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



RULES = ("bound", "finished")


def load(model_path):
    """(Keras Transformer, its export's DecodingOptions or the defaults, spm bytes) of a
    SavedModel export or version dir (its variables), a run dir or a preset dir."""
    from tfxformer import Transformer, pretrained
    from tfxformer.config import DecodingOptions

    model, record, spm = pretrained.load_source(Transformer, model_path)
    return model, record.decoding or DecodingOptions(), spm


def exit_steps(model, spm, lines, args, decoding, stopping):
    """Per line {"text", "steps", "length", "limit"}: the best translation, the steps its
    sentence ran, its tokens (EOS included) and its limit, by beam_search with `stopping`."""
    import sentencepiece
    import tensorflow as tf

    from tfxformer.decoding import beam_search
    from tfxformer.ids import EOS_ID

    sp = sentencepiece.SentencePieceProcessor(model_proto=spm)
    sources = [sp.encode(line)[: decoding.max_input_tokens - 1] + [EOS_ID] for line in lines]
    search = tf.function(lambda src: beam_search(
        model, src, args.beam_size, args.alpha, decoding.extra_length,
        max_output_length=decoding.max_output_tokens, stopping=stopping,
        length_normalization=args.length_normalization),
        input_signature=[tf.TensorSpec([None, None], tf.int32)])
    cap = min(decoding.max_output_tokens, model.model_config.max_positions)
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    out = [None] * len(sources)
    for start in range(0, len(order), args.batch_size):
        rows = order[start:start + args.batch_size]
        best = search(tf.ragged.constant([sources[i] for i in rows]).to_tensor())
        for i, ids, length, steps in zip(rows, best.ids[:, 0].numpy(),
                                         best.lengths[:, 0].numpy(), best.steps.numpy(),
                                         strict=True):
            tokens = [t for t in ids[:length].tolist() if t != EOS_ID]
            out[i] = {"text": sp.decode(tokens), "steps": int(steps), "length": int(length),
                      "limit": min(len(sources[i]) + decoding.extra_length, cap)}
    return out


def rule_speed(model, spm, lines, args, decoding):
    """Sentences/s of the exported translator with each rule: --repeats alternating passes
    after an untimed one, medians."""
    from tfxformer.serving import Translator

    translators = {rule: Translator(model, spm, beam_size=args.beam_size, alpha=args.alpha,
                                    extra_length=decoding.extra_length,
                                    max_input_tokens=decoding.max_input_tokens,
                                    max_output_tokens=decoding.max_output_tokens,
                                    stopping=rule,
                                    length_normalization=args.length_normalization)
                   for rule in RULES}
    times = {rule: [] for rule in RULES}
    for rule in RULES:
        translate_all(translators[rule], lines, args.batch_size)
    for repeat in range(args.repeats):
        for rule in RULES:
            seconds, _ = bl.timed(lambda t=translators[rule]: translate_all(
                t, lines, args.batch_size))
            times[rule].append(seconds)
            bl.log(f"{rule} pass {repeat}: {seconds:.2f} s, {len(lines) / seconds:.1f} sent/s")
    return {rule: round(len(lines) / statistics.median(t), 1) for rule, t in times.items()}


def stopping_steps(args):
    """--stopping-steps: per file and rule, mean steps against mean output length, BLEU."""
    import sacrebleu

    model, decoding, spm = load(args.model)
    bl.log(f"model {args.model}: beam {args.beam_size}, alpha {args.alpha}, extra length "
           f"{decoding.extra_length}, limits {decoding.max_input_tokens} / "
           f"{decoding.max_output_tokens}, length normalization {args.length_normalization}")
    sets, per_sentence = [], []
    for text, refs in zip(args.text, args.refs, strict=True):
        lines, references = read_lines(text, args.limit), read_lines(refs, args.limit)
        runs = {rule: exit_steps(model, spm, lines, args, decoding, rule) for rule in RULES}
        row = {"set": os.path.basename(text), "sentences": len(lines)}
        for rule, out in runs.items():
            steps = [o["steps"] for o in out]
            row[rule] = {
                "mean_steps": round(statistics.mean(steps), 2),
                "mean_length": round(statistics.mean(o["length"] for o in out), 2),
                "mean_steps_after_best_ended": round(statistics.mean(
                    o["steps"] - o["length"] for o in out), 2),
                "at_limit": sum(o["steps"] >= o["limit"] for o in out),
                "bleu": round(sacrebleu.corpus_bleu([o["text"] for o in out],
                                                    [references]).score, 2)}
            bl.log(f"{row['set']} {rule}: {json.dumps(row[rule])}")
        row["identical"] = sum(a["text"] == b["text"] for a, b in zip(*runs.values(),
                                                                      strict=True))
        row["steps_ratio"] = round(row["finished"]["mean_steps"] / row["bound"]["mean_steps"], 3)
        if args.repeats:
            row["sentences_per_second"] = rule_speed(model, spm, lines, args, decoding)
        sets.append(row)
        for i, (bound, ended) in enumerate(zip(runs["bound"], runs["finished"], strict=True)):
            per_sentence.append({
                "set": row["set"], "line": i, "limit": bound["limit"],
                "bound_steps": bound["steps"], "bound_length": bound["length"],
                "finished_steps": ended["steps"], "finished_length": ended["length"]})
    if args.steps_file:
        with open(args.steps_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in per_sentence)
    bl.emit({"bench": "ab_translate", "mode": "stopping_steps", "model": args.model,
             "beam_size": args.beam_size, "alpha": args.alpha,
             "length_normalization": args.length_normalization, "sets": sets,
             "peak_rss_mib": bl.peak_rss_mib(), **bl.machine()})


if __name__ == "__main__":
    main()
