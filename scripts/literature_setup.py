"""The Multi30k task as the literature sets it: train and decode on tokenized, lowercased text.

Wu et al. (2021) and the papers that reuse their data train on the dataset's `lc.norm.tok`
text (lowercased, Moses punctuation-normalised, Moses-tokenised, XML-escaped) and score
their output as it comes, with multi-bleu, against the `lc.norm.tok` references. The
shipped models solve a harder task: cased, detokenised output, lowercased and tokenised
afterwards. This script writes the literature's version of the data, so the same recipe
can be trained on it and the two tasks compared like for like:

    python scripts/literature_setup.py --data ../shared/data/multi30k --out runs/m30k_lc_tok
    python scripts/train_wmt.py --data runs/m30k_lc_tok --preset multi30k ...
    python scripts/evaluate.py --model RUN_DIR --data runs/m30k_lc_tok \\
        --sets test_2016_flickr test_2017_flickr --metric tokenized --beam-size 5 --alpha 1.0

The training split is tokenised with :func:`tfxformer.bleu.multi30k_tokenize` (the dataset
does not ship its tokenized training files; applied to the raw test references the same
function reproduces the shipped tokenized files). Validation and test targets are the
dataset's own `tok/<split>.lc.norm.tok.<lang>` files where they exist, so
`evaluate.py --metric tokenized` (BLEU with no further tokenisation) is multi-bleu against
exactly the references the papers use.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tqdm import tqdm  # noqa: E402

from tfxformer.bleu import multi30k_tokenize  # noqa: E402
from tfxformer.data.sources import iter_lines  # noqa: E402

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")


def prepare_split(data: str, out: str, split: str, lang: str) -> int:
    """Writes OUT/SPLIT.LANG in the lc.norm.tok form; returns its number of lines."""
    shipped = os.path.join(data, "tok", f"{split}.lc.norm.tok.{lang}")
    if os.path.isfile(shipped):
        lines = [*iter_lines(shipped)]
    else:
        raw = [*iter_lines(os.path.join(data, f"{split}.{lang}"))]
        lines = multi30k_tokenize(tqdm(raw, desc=f"{split}.{lang}", unit=" lines",
                                       mininterval=2), lang)
    path = os.path.join(out, f"{split}.{lang}")
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    os.replace(path + ".part", path)
    return len(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "multi30k"),
                        help="Multi30k folder with raw SPLIT.LANG files and tok/ "
                             "(default: %(default)s)")
    parser.add_argument("--out", required=True, help="folder to write SPLIT.LANG files to")
    parser.add_argument("--langs", nargs="+", default=["en", "de", "fr"],
                        help="languages to write (default: %(default)s)")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS),
                        help="splits to write (default: %(default)s)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        print(f"literature_setup.py: error: --data {args.data!r} is not a folder",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for split in args.splits:
        counts = {lang: prepare_split(args.data, args.out, split, lang) for lang in args.langs}
        if len(set(counts.values())) != 1:
            print(f"literature_setup.py: error: {split} has unequal line counts {counts}",
                  file=sys.stderr)
            return 2
        print(f"{split}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
