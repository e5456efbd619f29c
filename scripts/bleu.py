"""Score a hypothesis file against a reference file, both BLEU conventions.

    python scripts/bleu.py --hyp newstest2014.hyp.de --ref ../shared/data/wmt14/newstest2014.de

Prints one JSON line: sacreBLEU (cased, 13a, detokenized) with its signature, lowercased
sacreBLEU, chrF, and the paper's tokenized BLEU with hyphenated compounds split
(tensor2tensor's get_ende_bleu.sh).
"""

import argparse
import json
import sys

from tfxformer.bleu import compound_split_bleu, sacrebleu_scores


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hyp", required=True, help="detokenized hypotheses, one per line")
    parser.add_argument("--ref", required=True, help="reference translations, one per line")
    parser.add_argument("--lang", default="de",
                        help="target language for the Moses tokenizer (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        hyps, refs = _read(args.hyp), _read(args.ref)
        scores = sacrebleu_scores(hyps, refs)
        scores["bleu_compound_split"] = compound_split_bleu(hyps, refs, args.lang)
    except (OSError, ValueError) as error:
        print(f"bleu.py: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
