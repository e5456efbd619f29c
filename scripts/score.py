#!/usr/bin/env python
"""Score given translations: log P(target | source) of each line pair, teacher-forced.

    python scripts/score.py --model saved_models/multi30k_en_de \\
        --src test.en --tgt test.de > scores.tsv

As fairseq's --score-reference and OpenNMT's `score` (corpus filtering, reranking, a
quality-estimation baseline). One line out per pair, in order, tab-separated: the total
log-probability log P(target | source) and the length-normalised score, the total
divided by the number of target tokens (its SentencePiece pieces plus EOS: the mean
log-probability per token); with --tokens a third column holds the per-token
log-probabilities, space-separated. --model is a SavedModel with the `score` signature
(version dir or export dir; an ensemble export too), a trained run dir, or a preset dir of
Transformer.save_to_preset (a CTranslate2 dir does not score: an error). Progress and a
summary go to stderr.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402

BUFFER_BATCHES = 16  # pairs read ahead, in batches, and sorted by length to batch well



def build_parser():
    from tfxformer.config import DecodingOptions

    parser = argparse.ArgumentParser(
        prog="python scripts/score.py",
        description="Print log P(target | source) of each line pair of --src and --tgt with "
                    "a tfxformer model: one tab-separated line per pair, the total "
                    "log-probability and the length-normalised score (total / target "
                    "tokens, EOS included).")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="exported SavedModel with the `score` signature (version dir, or "
                             "its export dir: highest version; an ensemble export too), a "
                             "trained run dir, or a preset dir of Transformer.save_to_preset")
    parser.add_argument("--src", required=True, metavar="FILE",
                        help="source sentences, one per line (UTF-8; invalid bytes are "
                             "read as U+FFFD)")
    parser.add_argument("--tgt", required=True, metavar="FILE",
                        help="target sentences, one per line, as many lines as --src")
    parser.add_argument("--tokens", action="store_true",
                        help="add a third column: the log-probability of each target token "
                             "(pieces, then EOS), space-separated")
    parser.add_argument("--batch-size", type=cli.int_at_least(1),
                        default=DecodingOptions().batch_size, metavar="N",
                        help="pairs per scoring call (default: %(default)s)")
    parser.add_argument("--target-language", metavar="LANG",
                        help="a multilingual model's target language (one of its target "
                             "languages; required for such a model)")
    parser.add_argument("--checkpoint", help="checkpoint prefix of a run dir (default: the "
                        "averaged checkpoint, else the newest)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                        help="compute type of a run dir's or preset dir's model; a "
                             "SavedModel computes as exported (default: %(default)s)")
    return parser



def read_pairs(src, tgt):
    """Yields (source, target) byte strings, line by line, without their line ends."""
    with open(src, "rb") as sources, open(tgt, "rb") as targets:
        for source, target in zip(sources, targets, strict=True):
            yield source.rstrip(b"\r\n"), target.rstrip(b"\r\n")


def score_stream(score, pairs, batch_size):
    """Yields a :class:`PairScore` per pair, in order: reads `batch_size * BUFFER_BATCHES`
    pairs ahead and scores them."""
    pairs = iter(pairs)
    while buffer := list(itertools.islice(pairs, batch_size * BUFFER_BATCHES)):
        yield from score([s for s, _ in buffer], [t for _, t in buffer])


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    total = cli.line_pairs(parser, args.src, args.tgt)
    from tfxformer.locate import resolve
    from tfxformer.serving import load_score_fn
    from tfxformer.serving.scoring import format_score
    from tfxformer.serving.signatures import KINDS

    try:
        resolve(args.model, KINDS, "scripts/score.py --model")
        score = load_score_fn(args.model, batch_size=args.batch_size,
                              precision=args.precision, checkpoint=args.checkpoint,
                              target_language=args.target_language)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(score.describe(), file=sys.stderr)
    from tqdm import tqdm

    count, truncated, log_prob, tokens = 0, 0, 0.0, 0
    start = time.perf_counter()
    with tqdm(total=total, unit=" pair", file=sys.stderr, desc="scoring") as progress:
        for result in score_stream(score, read_pairs(args.src, args.tgt), args.batch_size):
            sys.stdout.write(format_score(result, args.tokens) + "\n")
            count, truncated = count + 1, truncated + result.truncated
            log_prob, tokens = log_prob + result.log_prob, tokens + len(result.token_log_probs)
            progress.update()
    sys.stdout.flush()
    seconds = time.perf_counter() - start
    print(f"scored {count} pairs in {seconds:.1f} s ({count / max(seconds, 1e-9):.1f} "
          f"pairs/s); {tokens} target tokens, mean log-probability "
          f"{log_prob / max(tokens, 1):.4f}", file=sys.stderr)
    if truncated:
        print(f"{truncated} pairs were cut to the model's token limits (max_input_tokens / "
              "max_output_tokens): their scores are those of the kept tokens",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
