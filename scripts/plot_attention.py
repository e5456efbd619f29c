#!/usr/bin/env python
"""Draw the attention weights of one translated sentence (greedy decoding) to a PNG.

    python scripts/plot_attention.py --model runs/base --text "A dog runs." -o attention.png

One row per (kind, layer), one column per head; kinds: encoder self-attention, decoder
self-attention, encoder-decoder ("cross") attention. Needs a trained run dir (a SavedModel
does not return attention weights); its checkpoint is the one export and translation
load (averaged first), or --checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import Transformer  # noqa: E402
from tfxformer.analysis import KINDS, plot_attention, sentence_attention  # noqa: E402
from tfxformer.config import DecodingOptions  # noqa: E402
from tfxformer.pretrained import load_run_dir  # noqa: E402
from tfxformer.serving import resolve_model_dir  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="trained run dir (config.json, spm.model, checkpoints/)")
    parser.add_argument("--checkpoint", help="checkpoint prefix (default: the newest that "
                        "the state file names, averaged first)")
    parser.add_argument("--text", required=True, help="the source sentence to translate")
    parser.add_argument("-o", "--output", default="attention.png",
                        help="PNG file to write (default: %(default)s)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="attention kinds to draw (default: all)")
    parser.add_argument("--layers", type=int, nargs="+", metavar="I",
                        help="0-based layer indices to draw (default: all)")
    parser.add_argument("--extra-length", type=int, default=DecodingOptions().extra_length,
                        metavar="N",
                        help="maximum output length = source tokens + N (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        kind, path = resolve_model_dir(args.model)
        if kind != "run_dir":
            raise ValueError(f"{path!r} is a SavedModel, which does not return attention "
                             "weights; give the trained run dir it was exported from.")
        model, _, spm_bytes = load_run_dir(Transformer, path, args.checkpoint)
        attention = sentence_attention(model, spm_bytes, args.text,
                                       extra_length=args.extra_length)
        plot_attention(attention, args.output, kinds=args.kinds, layers=args.layers)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(f"{args.output}: {' '.join(attention.source_tokens)} -> "
          f"{' '.join(attention.target_tokens)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
