#!/usr/bin/env python
"""Vocabulary shortlist sizes against BLEU: the shipped model re-exported per (K, N).

For each K,N of --grid (and once without a shortlist, "full"), this runs the documented
commands in their own processes:

  python scripts/export.py --model MODEL --export-dir WORK/kKnN --shortlist K,N
  python scripts/evaluate.py --model WORK/kKnN/1 --data DATA --tgt de --sets test_2016_flickr

(an existing WORK/<name>/1 is reused), then measures the shortlist length L per batch of
64 (--batch-size) as the exported translator forms them: each source SentencePiece-encoded,
cut to max_input_tokens - 1, then EOS; sorted by length, longest first; chunks of 64; L =
the union of the exported table's rows of the chunk's tokens, the frequent ids and the 4
special ids (tfxformer.decoding.shortlist.shortlist_ids, in numpy on the exported table).
--length-sets lists the sets L is measured on (BLEU is only on test_2016_flickr).

  PYTHONPATH=$PWD python bench/shortlist_grid.py --work-dir /tmp/shortlist_grid
  PYTHONPATH=$PWD python bench/shortlist_grid.py --grid 50,500 --no-bleu   # L only

Prints one JSON line per export and a markdown table; BLEU is cased sacreBLEU (13a).
Translation speed is not measured here (bench/translate_real.py, tfxformer-shortlist).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "saved_models", "multi30k_en_de")
DATA = os.path.join(REPO, "..", "shared", "data")
SETS = {"test_2016_flickr": "multi30k", "newstest2014": "wmt14"}
GRID = "20,200 20,500 20,1000 50,200 50,500 50,1000 100,200 100,500 100,1000"


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode:
        raise RuntimeError(f"{cmd[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def export(args, name, sizes):
    version = os.path.join(args.work_dir, name, "1")
    if not os.path.isdir(version):
        flags = [] if sizes is None else ["--shortlist", f"{sizes[0]},{sizes[1]}"]
        run([sys.executable, os.path.join(REPO, "scripts", "export.py"), "--model", args.model,
             "--export-dir", os.path.join(args.work_dir, name), *flags])
    return version


def bleu(version, name):
    out = run([sys.executable, os.path.join(REPO, "scripts", "evaluate.py"), "--model", version,
               "--data", os.path.join(DATA, "multi30k"), "--tgt", "de", "--sets",
               "test_2016_flickr", "--label", name])
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return round(rows[0]["bleu"], 2)


def lengths(version, sets, batch_size):
    """{set: (mean, min, max) shortlist length per batch} of the export at `version`."""
    import sentencepiece
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

    loaded = tf.saved_model.load(version)
    table, frequent = loaded.shortlist_table.numpy(), loaded.shortlist_frequent.numpy()
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        limit = json.load(f)["decoding"]["max_input_tokens"]
    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(version, "assets", "spm.model"))
    result = {}
    for name in sets:
        with open(os.path.join(DATA, SETS[name], f"{name}.en"), encoding="utf-8") as f:
            sources = [ids[: limit - 1] + [3] for ids in sp.encode(f.read().splitlines())]
        sources = sorted(sources, key=len, reverse=True)  # the translator's order
        sizes = []
        for start in range(0, len(sources), batch_size):
            tokens = np.unique(np.concatenate(sources[start:start + batch_size]))
            sizes.append(np.union1d(np.union1d(table[tokens].ravel(), frequent),
                                    np.arange(4)).size)
        result[name] = (round(float(np.mean(sizes)), 1), int(min(sizes)), int(max(sizes)))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL,
                    help="SavedModel (or export dir: its highest version) to re-export "
                         "(default: the shipped saved_models/multi30k_en_de; its config "
                         "names the training data)")
    ap.add_argument("--work-dir", default="/tmp/shortlist_grid",
                    help="where the exports go; existing ones are reused (default: %(default)s)")
    ap.add_argument("--grid", default=GRID,
                    help="space-separated K,N pairs (default: %(default)s)")
    ap.add_argument("--length-sets", nargs="+", default=list(SETS), choices=list(SETS),
                    help="sets the shortlist length per batch is measured on (default: all)")
    ap.add_argument("--batch-size", type=int, default=64,
                    help="sentences per batch, as the export's --batch-size (default: 64)")
    ap.add_argument("--no-bleu", action="store_true", help="only the shortlist lengths")
    args = ap.parse_args(argv)
    grid = [tuple(int(v) for v in pair.split(",")) for pair in args.grid.split()]
    from tfxformer.serving import resolve_model_dir

    _, args.model = resolve_model_dir(args.model)  # an export dir -> its highest version
    with open(os.path.join(args.model, "assets", "config.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab_size"]
    rows = []
    if not args.no_bleu:
        version = export(args, "full", None)
        rows.append({"shortlist": "full", "bleu": bleu(version, "full")})
        print(json.dumps(rows[-1]), flush=True)
    for k, n in grid:
        name = f"k{k}n{n}"
        version = export(args, name, (k, n))
        row = {"shortlist": f"{k},{n}"}
        if not args.no_bleu:
            row["bleu"] = bleu(version, name)
        row["length_mean_min_max"] = lengths(version, args.length_sets, args.batch_size)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n| K,N | BLEU test_2016 | L per batch of {args.batch_size}, mean (min–max): "
          + " | ".join(args.length_sets) + " |")
    print("|---|---|" + "---|" * len(args.length_sets))
    for row in rows:
        sizes = row.get("length_mean_min_max", {})
        cells = [f"{sizes[s][0]:.0f} ({sizes[s][1]}–{sizes[s][2]})" if s in sizes else str(vocab)
                 for s in args.length_sets]
        print(f"| {row['shortlist']} | {row.get('bleu', '')} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
