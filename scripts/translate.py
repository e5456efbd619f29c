#!/usr/bin/env python
"""Translate stdin to stdout, one line out per line in, in order (beam search, §6.1).

    python scripts/translate.py --model saved_models/en_de < input.en > output.de

--model is an exported SavedModel (a version dir, or its export dir: the highest version
is taken) or a trained run dir (config.json, spm.model, checkpoints/). Progress and
throughput go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BUFFER_BATCHES = 16  # lines read ahead, in batches, and sorted by length to batch well


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Translate lines from stdin to stdout with a tfxformer model. One output "
                    "line per input line, in order; progress and throughput on stderr.")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="exported SavedModel version dir, its parent export dir (highest "
                             "version taken), or a trained run dir with checkpoints")
    from tfxformer.config import DecodingOptions  # plain settings: no TensorFlow yet

    defaults = DecodingOptions()
    parser.add_argument("--beam-size", type=_int_at_least(1), metavar="N",
                        help="beam size, 1 = greedy (default: the export's, else "
                             f"{defaults.beam_size})")
    parser.add_argument("--alpha", type=_non_negative_float, metavar="A",
                        help="length penalty exponent α in ((5 + |Y|) / 6)^α, 0 = none "
                             f"(default: the export's, else {defaults.alpha})")
    parser.add_argument("--batch-size", type=_int_at_least(1), default=defaults.batch_size,
                        metavar="N", help="sentences per translation call (default: "
                        "%(default)s)")
    parser.add_argument("--extra-length", type=_int_at_least(0), metavar="N",
                        help="maximum output length = source tokens + N "
                             f"(default: the export's, else {defaults.extra_length})")
    parser.add_argument("--target-language", metavar="LANG",
                        help="the language a multilingual model translates into (one of "
                             "its target languages, e.g. de; required for such a model)")
    return parser, parser.parse_args(argv)


def translate_stream(translate, lines, batch_size):
    """Yields one output per input line, in order: reads `batch_size * BUFFER_BATCHES`
    lines ahead and calls `translate` on batches of similar length."""
    from tfxformer.serving.batching import translate_in_length_order

    buffer = []
    for line in lines:
        buffer.append(line)
        if len(buffer) == batch_size * BUFFER_BATCHES:
            yield from translate_in_length_order(translate, buffer, batch_size)
            buffer = []
    yield from translate_in_length_order(translate, buffer, batch_size)


def main(argv=None):
    parser, args = parse_args(argv)
    from tfxformer.serving import load_translate_fn

    try:
        translate = load_translate_fn(args.model, beam_size=args.beam_size, alpha=args.alpha,
                                      extra_length=args.extra_length,
                                      batch_size=args.batch_size,
                                      target_language=args.target_language)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(translate.describe(), file=sys.stderr)
    from tqdm import tqdm

    lines = (line.rstrip(b"\r\n") for line in sys.stdin.buffer)
    count, words, start = 0, 0, time.perf_counter()
    with tqdm(unit=" sent", file=sys.stderr, desc="translating") as progress:
        for text in translate_stream(translate, lines, args.batch_size):
            text = text.replace("\r", " ").replace("\n", " ")  # one line out per line in
            sys.stdout.buffer.write(text.encode("utf-8") + b"\n")
            count, words = count + 1, words + len(text.split())
            progress.update()
    sys.stdout.flush()
    seconds = time.perf_counter() - start
    print(f"translated {count} lines in {seconds:.1f} s: {count / max(seconds, 1e-9):.2f} "
          f"sentences/s, {words / max(seconds, 1e-9):.1f} words/s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
