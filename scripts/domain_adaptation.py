"""Domain adaptation: the shipped EN->DE model (image captions) fine-tuned on Tatoeba EN-DE.

Writes the Tatoeba corpus as a train/val/test folder that train_wmt.py and evaluate.py read,
with held-out sets that never overlap training: pairs are grouped by their English *and*
their German sentence (a pair shares a group with every pair that has the same English or
the same German text), and whole groups go to one split. Held-out sets keep one pair per
group; training keeps every pair of its groups. The split is a deterministic function of
`--seed`.

    python scripts/domain_adaptation.py --out runs/tatoeba
    # before: the shipped model on the new domain
    python scripts/evaluate.py --model saved_models/multi30k_en_de --data runs/tatoeba --sets test
    # fine-tuned from the shipped model, and the same model from scratch, same steps
    python scripts/train_wmt.py --init-from saved_models/multi30k_en_de --data runs/tatoeba ...
    python scripts/train_wmt.py --preset multi30k --vocab-size 8000 --data runs/tatoeba ...

docs/results/domain_adaptation.md has the exact commands and the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tfxformer.data.sources import iter_lines  # noqa: E402

DEFAULT_DATA = os.path.join("..", "shared", "data", "tatoeba")


def group_pairs(pairs: list[tuple[str, str]]) -> list[int]:
    """The group of each pair: connected components of "same English or same German text"."""
    parent = list(range(len(pairs)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_seen: dict[tuple[int, str], int] = {}
    for i, (en, de) in enumerate(pairs):
        for key in ((0, en), (1, de)):
            j = first_seen.setdefault(key, i)
            parent[root(i)] = root(j)
    return [root(i) for i in range(len(pairs))]


def split_pairs(pairs: list[tuple[str, str]], held_out: dict[str, int], seed: int = 0
                ) -> dict[str, list[tuple[str, str]]]:
    """{"train": [...], name: [...] for name in held_out}: held-out sets of `held_out[name]`
    pairs, one per group, and every pair of the remaining groups in "train"."""
    groups = group_pairs(pairs)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    order = sorted(members)
    random.Random(seed).shuffle(order)
    needed = sum(held_out.values())
    if needed >= len(order):
        raise ValueError(f"held-out sets of {needed} pairs need more than the corpus' "
                         f"{len(order)} groups of pairs.")
    splits, start = {}, 0
    for name, size in held_out.items():
        splits[name] = [pairs[members[g][0]] for g in order[start:start + size]]
        start += size
    splits["train"] = [pairs[i] for g in sorted(order[start:]) for i in members[g]]
    return splits


def write_split(out: str, name: str, pairs: list[tuple[str, str]], src: str, tgt: str):
    for index, lang in ((0, src), (1, tgt)):
        path = os.path.join(out, f"{name}.{lang}")
        with open(path + ".part", "w", encoding="utf-8") as f:
            f.write("".join(pair[index] + "\n" for pair in pairs))
        os.replace(path + ".part", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA, help="folder with tatoeba.en.gz and "
                        "tatoeba.de.gz (default: %(default)s)")
    parser.add_argument("--out", required=True, help="folder to write train/val/test files to")
    parser.add_argument("--val", type=int, default=1000, help="validation pairs (default: "
                        "%(default)s)")
    parser.add_argument("--test", type=int, default=2000, help="test pairs (default: "
                        "%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default: %(default)s)")
    args = parser.parse_args(argv)
    paths = [os.path.join(args.data, f"tatoeba.{lang}.gz") for lang in ("en", "de")]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        print(f"domain_adaptation.py: error: missing {missing}; --data must be the folder "
              "with tatoeba.en.gz and tatoeba.de.gz", file=sys.stderr)
        return 2
    english, german = ([*iter_lines(p)] for p in paths)
    pairs = [(e.strip(), d.strip()) for e, d in zip(english, german, strict=True)
             if e.strip() and d.strip()]
    try:
        splits = split_pairs(pairs, {"test": args.test, "val": args.val}, args.seed)
    except ValueError as error:
        print(f"domain_adaptation.py: error: {error}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for name, split in splits.items():
        write_split(args.out, name, split, "en", "de")
        print(f"{name}: {len(split)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
