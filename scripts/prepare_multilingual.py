"""Writes a multilingual data folder: one source language, several targets, tagged sources.

One model for several target languages (Johnson et al., 2017) trains on the pairs of every
direction at once, each source starting with the tag of its target (`<2de> A dog runs.`;
tfxformer.multilingual). From a folder of parallel files SPLIT.LANG this writes
OUT/SPLIT.SRC (tagged) and OUT/SPLIT.mul (the targets), every target's pairs one after the
other; training shuffles them. For Multi30k EN -> DE and FR:

    python scripts/prepare_multilingual.py --data ../shared/data/multi30k --src en \\
        --targets de fr --out runs/m30k_en_defr
    python scripts/train_wmt.py --data runs/m30k_en_defr --src en --tgt mul \\
        --target-languages de,fr --preset multi30k ... --model-dir runs/m30k_multi
    python scripts/evaluate.py --model runs/m30k_multi --target-language fr \\
        --data ../shared/data/multi30k --tgt fr --sets val

The validation split keeps the targets in order, so the validation BLEU that training logs
on its first sentences is the first target's.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tfxformer import multilingual  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "multi30k"),
                        help="folder with parallel SPLIT.LANG files (default: %(default)s)")
    parser.add_argument("--src", default="en", help="source language (default: %(default)s)")
    parser.add_argument("--targets", nargs="+", required=True,
                        help="two or more target languages, e.g. de fr")
    parser.add_argument("--out", required=True,
                        help="folder to write SPLIT.SRC and SPLIT.mul to (created)")
    parser.add_argument("--splits", nargs="+", default=["train", "val"],
                        help="splits to write (default: %(default)s); score test sets per "
                             "target on the original folder")
    args = parser.parse_args(argv)
    try:
        counts = multilingual.write_folder(args.data, args.out, args.src, args.targets,
                                           args.splits)
    except (OSError, ValueError) as error:
        print(f"prepare_multilingual.py: error: {error}", file=sys.stderr)
        return 2
    for split, lines in counts.items():
        print(f"{os.path.join(args.out, split)}.{{{args.src},{multilingual.MULTI_TARGET}}}: "
              f"{lines} pairs")
    print(f"train with: --data {args.out} --src {args.src} --tgt {multilingual.MULTI_TARGET} "
          f"--target-languages {','.join(args.targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
