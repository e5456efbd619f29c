#!/usr/bin/env python
"""Draw the attention weights of one translated sentence (greedy decoding) to a PNG.

    python scripts/plot_attention.py --model runs/base --text "A dog runs." -o attention.png

One row per (kind, layer), one column per head; kinds: encoder self-attention, decoder
self-attention, encoder-decoder ("cross") attention. --model is a trained run dir (its
checkpoint the one export and translation load, averaged first, or --checkpoint), a preset
dir of Transformer.save_to_preset, or a SavedModel of one model (its weights read into a
Keras model, which returns the attention weights). A multilingual model's --text starts
with its target tag, e.g. "<2fr> A dog runs.".
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tfxformer import Transformer  # noqa: E402
from tfxformer.analysis import KINDS, plot_attention, sentence_attention  # noqa: E402
from tfxformer.config import DecodingOptions  # noqa: E402
from tfxformer.locate import ONE_MODEL, resolve  # noqa: E402
from tfxformer.pretrained import load_source  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="trained run dir (config.json, spm.model, checkpoints/), preset "
                             "dir of Transformer.save_to_preset, or SavedModel of one model "
                             "(version or export dir)")
    parser.add_argument("--checkpoint", help="a run dir's checkpoint prefix (default: the "
                        "newest that the state file names, averaged first)")
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
        resolve(args.model, ONE_MODEL, "scripts/plot_attention.py --model")
        model, _, spm_bytes = load_source(Transformer, args.model, args.checkpoint)
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
