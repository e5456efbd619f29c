#!/usr/bin/env python
"""Rerank n-best lists: pick each source's translation by a weighted sum of scores.

    python scripts/export.py --model saved_models/multi30k_en_de --export-dir /tmp/en_de
    python scripts/translate.py --model /tmp/en_de --n-best 8 --beam-size 8 \\
        < val.en > val.nbest
    python scripts/rerank.py --nbest val.nbest --source val.en \\
        --channel-model saved_models/multi30k_de_en \\
        --weight forward=1 --weight channel_mean=0.5 --weight length=0.05 > val.reranked.de

The n-best file holds Moses n-best lines `i ||| translation ||| score` (i counts source
lines from 0; `scripts/translate.py --n-best K` writes them from an export's
`translate_nbest` signature: an export made before it existed is re-exported first, as
above); the output is one line per source line, its best candidate (an empty line for a
source without candidates, with a warning). Each --weight NAME=VALUE turns a score on
(tfxformer.rerank):

  forward              the n-best file's own score (the search's log P(y|x) / lp(y))
  length               |y|, the candidate's words
  channel              log P(x|y) by --channel-model, a model of the other direction
  channel_mean         the same per scored token
  right_to_left        log P(y|x) by --r2l-model, a model trained with --reverse-target
  right_to_left_mean   the same per scored token
  mbr_bleu, mbr_chrf   minimum Bayes risk: the mean sentence BLEU / chrF (sacreBLEU) of
                       the candidate against the other candidates of its list

Without any --weight, forward=1 (each list's best-scored candidate). docs/reranking.md
describes the scores and what they gave on Multi30k.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli, rerank  # noqa: E402

# The model flag of each rescoring role this script takes.
ROLE_FLAGS = {"channel": "channel_model", "right_to_left": "r2l_model"}
# Score name -> the model flag it needs, or None (tfxformer.rerank.WEIGHTS).
FEATURES = {name: ROLE_FLAGS.get(weight.role) for name, weight in rerank.WEIGHTS.items()
            if weight.role is None or weight.role in ROLE_FLAGS}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python scripts/rerank.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nbest", required=True, metavar="FILE",
                        help="Moses n-best lines 'i ||| translation ||| score' ('-': stdin; "
                             "UTF-8, invalid bytes read as U+FFFD)")
    parser.add_argument("--source", metavar="FILE",
                        help="the source lines the n-best lists translate, one per line "
                             "(needed by channel and right_to_left; it also fixes how many "
                             "lines the output has: without it, the largest index + 1)")
    parser.add_argument("--weight", type=cli.named_weight(tuple(FEATURES)), action="append",
                        default=[],
                        metavar="NAME=VALUE",
                        help="a score and its weight, repeatable; NAME one of "
                             f"{', '.join(FEATURES)} (default: forward=1)")
    parser.add_argument("--channel-model", metavar="DIR",
                        help="the backward model of channel / channel_mean: a SavedModel with "
                             "the `score` signature or a run dir translating target -> source")
    parser.add_argument("--r2l-model", metavar="DIR",
                        help="the right-to-left model of right_to_left / right_to_left_mean "
                             "(trained with --reverse-target; a SavedModel or run dir)")
    parser.add_argument("--output", metavar="FILE",
                        help="write the chosen translations here (default: stdout)")
    parser.add_argument("--scores", metavar="FILE",
                        help="also write one JSON line per source: each candidate's text, "
                             "scores and combined score, and the chosen index")
    parser.add_argument("--batch-size", type=cli.int_at_least(1), default=64, metavar="N",
                        help="pairs per scoring call of the models (default: %(default)s)")
    return parser


def _read_lines(path):
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    try:
        return [line.rstrip(b"\r\n") for line in stream]
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _scorers(names, args, parser):
    """{name: scorer} of the weighted names; the models are loaded once each."""
    loaded, scorers = {}, {}
    for name in names:
        flag = FEATURES[name]
        if flag is None:
            scorers[name] = rerank.scorer(name)
        else:
            path = getattr(args, flag)
            if path is None:
                parser.error(f"--weight {name}=... needs --{flag.replace('_', '-')}")
            if path not in loaded:
                from tfxformer.serving import load_score_fn

                try:
                    loaded[path] = load_score_fn(path, batch_size=args.batch_size)
                except (FileNotFoundError, ValueError) as err:
                    parser.exit(2, f"{parser.prog}: error: {err}\n")
            scorers[name] = rerank.scorer(name, loaded[path])
    return scorers


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    weights = dict(args.weight) or {"forward": 1.0}
    needs_source = any(FEATURES[name] for name in weights)
    if needs_source and args.source is None:
        parser.error("channel and right_to_left scores need --source")
    for flag, path in (("--nbest", args.nbest), ("--source", args.source)):
        if path not in (None, "-") and not os.path.isfile(path):
            parser.error(f"{flag} {path!r} is not a file")
    sources = None if args.source is None else \
        [s.decode("utf-8", errors="replace") for s in _read_lines(args.source)]
    try:
        lists = rerank.read_nbest(_read_lines(args.nbest),
                                  None if sources is None else len(sources), args.nbest)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    sources = sources if sources is not None else [""] * len(lists)
    missing = [i for i, row in enumerate(lists) if not row]
    if missing:
        print(f"rerank.py: warning: {len(missing)} source line(s) have no candidate (first: "
              f"line {missing[0] + 1}); their output lines are empty", file=sys.stderr)
    result = rerank.rerank(lists, sources, _scorers(weights, args, parser), weights)
    lines = [" ".join(text.split()) + "\n" for text in result.best]
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            out.writelines(lines)
    else:
        sys.stdout.writelines(lines)
    if args.scores:
        with open(args.scores, "w", encoding="utf-8") as f:
            for i, row in enumerate(lists):
                f.write(json.dumps({
                    "index": i, "chosen": result.index[i],
                    "candidates": [c.text for c in row], "combined": result.scores[i],
                    "scores": {name: values[i] for name, values in result.features.items()},
                }, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
