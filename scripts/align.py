#!/usr/bin/env python
"""Word-align sentence pairs with a trained model's attention: one Pharaoh line per pair.

    python scripts/align.py --model saved_models/multi30k_en_de \\
        --reverse-model saved_models/multi30k_de_en \\
        --src ../shared/data/multi30k/train.en --tgt ../shared/data/multi30k/train.de \\
        --output train.align

Each pair is read by --model teacher-forced, and each target piece is linked to the
source piece its alignment attention weighs most (the model's `alignment_layer`, by
default the penultimate decoder layer's heads averaged, as `translate_nbest` aligns its
translations); a line lists the word pairs "i-j" (source word i, target word j, 0-based,
words split at whitespace), sorted. With --reverse-model (a model of the other direction)
the swapped pairs are aligned too and both directions are symmetrized (--symmetrize). The
output is what `train_wmt.py --guided-alignment` trains on (Garg et al., 2019);
docs/markup.md, "Guided alignment". Progress and a summary go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import cli  # noqa: E402


def build_parser():
    from tfxformer.data.alignments import HEURISTICS

    parser = argparse.ArgumentParser(
        prog="python scripts/align.py",
        description="Print the word alignment of each line pair of --src and --tgt, read "
                    "from a tfxformer model's attention: one Pharaoh line ('0-0 1-2 ...') "
                    "per pair.")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="the source-to-target model: a SavedModel of this package "
                             "(version dir, or export dir: highest version), a trained run "
                             "dir, or a preset dir of Transformer.save_to_preset")
    parser.add_argument("--src", required=True, metavar="FILE",
                        help="source sentences, one per line (UTF-8)")
    parser.add_argument("--tgt", required=True, metavar="FILE",
                        help="target sentences, one per line, as many lines as --src")
    parser.add_argument("--reverse-model", metavar="DIR",
                        help="a target-to-source model (same forms as --model): the pairs "
                             "are aligned in both directions and symmetrized")
    parser.add_argument("--symmetrize", choices=HEURISTICS, default=HEURISTICS[0],
                        help="how the two directions combine, with --reverse-model "
                             "(default: %(default)s)")
    parser.add_argument("--output", metavar="FILE",
                        help="write the alignments here (default: standard output)")
    parser.add_argument("--batch-size", type=cli.int_at_least(1), default=64, metavar="N",
                        help="pairs per call (default: %(default)s)")
    return parser


def read_pairs(src, tgt):
    """Yields (source, target) strings, line by line (invalid UTF-8 read as U+FFFD)."""
    with open(src, encoding="utf-8", errors="replace") as sources, \
            open(tgt, encoding="utf-8", errors="replace") as targets:
        for source, target in zip(sources, targets, strict=True):
            yield source.rstrip("\r\n"), target.rstrip("\r\n")



def load_aligner(path, batch_size, direction=None):
    """A :class:`PairAligner` of the model at `path`, and its (src, tgt) direction; a
    `direction` given must be the model's (ValueError otherwise)."""
    from tfxformer import Transformer
    from tfxformer.analysis.word_alignment import PairAligner
    from tfxformer.pretrained import load_source

    model, record, spm_bytes = load_source(Transformer, path, tool="scripts/align.py")
    if direction is not None and (record.src, record.tgt) != direction:
        raise ValueError(f"--reverse-model {path!r} translates {record.src}->{record.tgt}; "
                         f"the reverse of --model is {direction[0]}->{direction[1]}.")
    aligner = PairAligner(model, spm_bytes, batch_size, record.reverse_target)
    return aligner, (record.src, record.tgt)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    total = cli.line_pairs(parser, args.src, args.tgt)
    from tqdm import tqdm

    from tfxformer.analysis.word_alignment import symmetrized

    try:
        forward, (src, tgt) = load_aligner(args.model, args.batch_size)
        backward = None if args.reverse_model is None else \
            load_aligner(args.reverse_model, args.batch_size, (tgt, src))[0]
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    lines = forward.stream(read_pairs(args.src, args.tgt))
    if backward is not None:
        swapped = ((t, s) for s, t in read_pairs(args.src, args.tgt))
        lines = symmetrized(lines, backward.stream(swapped), args.symmetrize)
    out = sys.stdout if args.output is None else open(  # noqa: SIM115
        args.output + ".part", "w", encoding="utf-8")
    start, links = time.perf_counter(), 0
    with tqdm(total=total, unit=" pair", file=sys.stderr, desc="aligning") as progress:
        for line in lines:
            out.write(line + "\n")
            links += len(line.split())
            progress.update()
    if args.output is not None:  # complete or not at all
        out.close()
        os.replace(args.output + ".part", args.output)
    seconds = time.perf_counter() - start
    print(f"aligned {total} pairs in {seconds:.1f} s ({total / max(seconds, 1e-9):.1f} "
          f"pairs/s); {links} links, {links / max(total, 1):.2f} a pair", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
