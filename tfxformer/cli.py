"""Argument types the command-line scripts share: a bad value is named with what is
accepted, in argparse's own usage error (`translate.py: error: argument --beam-size: must
be >= 1, got 0`). No TensorFlow."""

from __future__ import annotations

import argparse
import math
import os

__all__ = ["add_nbest_flags", "add_sampling_flags", "add_search_flags", "float_in",
           "int_at_least", "line_pairs", "named_weight", "non_negative_float"]


def int_at_least(low):
    """A parser of integers >= `low`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def non_negative_float(text):
    """A float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def float_in(low, high, low_open=True):
    """A parser of floats in (low, high] (or [low, high] with low_open=False)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not ((value > low if low_open else value >= low) and value <= high):
            bounds = f"{'(' if low_open else '['}{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {text}")
        return value
    return parse


def named_weight(names):
    """A parser of NAME=VALUE with NAME one of `names` and VALUE a finite float ->
    (NAME, VALUE) (the reranking weights of scripts/rerank.py and scripts/export.py)."""
    def parse(text):
        name, sep, value = text.partition("=")
        if not sep or name not in names:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME one of "
                                             f"{', '.join(names)}; got {text!r}")
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"the weight of {name} must be a number, got "
                                             f"{value!r}") from None
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"the weight of {name} must be finite, got "
                                             f"{value}")
        return name, number
    return parse


def add_search_flags(parser, defaults, own="a SavedModel's own"):
    """Adds --beam-size, --alpha, --extra-length (None: `own`, else those of `defaults`, a
    :class:`tfxformer.config.DecodingOptions`) and --batch-size to `parser`."""
    parser.add_argument("--beam-size", type=int_at_least(1), metavar="N",
                        help=f"beam size, 1 = greedy (default: {own}, else "
                             f"{defaults.beam_size})")
    parser.add_argument("--alpha", type=non_negative_float, metavar="A",
                        help="length penalty exponent α in ((5 + |Y|) / 6)^α (default: "
                             f"{own}, else {defaults.alpha})")
    parser.add_argument("--extra-length", type=int_at_least(0), metavar="N",
                        help=f"maximum output length = source tokens + N (default: {own}, "
                             f"else {defaults.extra_length})")
    parser.add_argument("--batch-size", type=int_at_least(1), default=defaults.batch_size,
                        metavar="N", help="sentences per translation call (default: "
                        "%(default)s)")


def add_nbest_flags(group):
    """Adds --n-best, --token-scores, --no-repeat-ngram-size and --repetition-penalty (the
    `translate_nbest` signature's options) to the parser or argument group `group`."""
    group.add_argument("--n-best", type=int_at_least(1), metavar="K",
                   help="print each line's K best translations (K <= the beam size) "
                        "as Moses n-best lines 'i ||| translation ||| score', i the "
                        "input line from 0, best first")
    group.add_argument("--token-scores", action="store_true",
                   help="with --n-best: add a fourth field to each line, each "
                        "SentencePiece piece of the translation and its "
                        "log-probability, 'piece=log-prob' separated by spaces (the "
                        "EOS '</s>' last; they add up to the score times the length "
                        "normalizer); as Moses appends its alignment field. Not with a "
                        "CTranslate2 model")
    group.add_argument("--no-repeat-ngram-size", type=int_at_least(0), metavar="N",
                   help="never repeat an n-gram of N tokens in an output (0 = off) "
                        "(default: 0)")
    group.add_argument("--repetition-penalty", type=float_in(0.0, float("inf")),
                   metavar="P", help="divide the positive logits of tokens an output "
                   "already holds by P and multiply their negative ones (P > 1 "
                   "discourages repeats; 1 = off) (default: 1)")


def add_sampling_flags(group, defaults):
    """Adds --sampling-topk, --sampling-temperature, --sampling-topp and --seed (the
    `translate_sampled` signature's options; defaults from `defaults`, a
    :class:`tfxformer.config.DecodingOptions`) to the parser or argument group `group`."""
    group.add_argument("--sampling-topk", type=int_at_least(0), metavar="K",
                   help="sample each token from the K most probable (e.g. 10); 0 = "
                        "from the whole vocabulary; 1 = greedy. Not with --beam-size "
                        "> 1 or --alpha")
    group.add_argument("--sampling-temperature", type=float_in(0.0, float("inf")),
                   metavar="T", help="divide the logits by T before sampling: < 1 "
                   f"sharper, > 1 flatter (default: {defaults.sampling_temperature})")
    group.add_argument("--sampling-topp", type=float_in(0.0, 1.0), metavar="P",
                   help="nucleus sampling: only the most probable tokens whose "
                        "probabilities reach P (default: "
                        f"{defaults.sampling_topp}, all)")
    group.add_argument("--seed", type=int_at_least(0), metavar="S",
                   help="seed of the draws: the same seed, input and --batch-size "
                        "give the same output (default: a random seed, printed to "
                        "stderr)")


def line_pairs(parser, src: str, tgt: str) -> int:
    """The number of line pairs of the files of --src and --tgt; a usage error (exit 2)
    where either is no file or their line counts differ."""
    for flag, path in (("--src", src), ("--tgt", tgt)):
        if not os.path.isfile(path):
            parser.error(f"{flag} {path!r} is not a file")
    total, targets = (_count_lines(path) for path in (src, tgt))
    if total != targets:
        parser.error(f"--src has {total} lines and --tgt {targets}; they must pair up line "
                     "by line")
    return total


def _count_lines(path: str) -> int:
    """The number of lines of `path` (a last line without a newline counts)."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)
