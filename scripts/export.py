"""Export a trained run dir (or re-export a SavedModel of this package) for TF Serving.

    python scripts/export.py --model runs/base --export-dir saved_models/en_de
    python scripts/export.py --model saved_models/multi30k_en_de/1 \
        --export-dir saved_models/multi30k_en_de          # re-export with today's code

Writes `<export-dir>/<next version>/` (saved_model.pb, variables/, assets/, and
assets.extra/ with TF Serving warm-up records and an example batching_parameters.txt)
and prints its path. See README, "Serving".
"""

from __future__ import annotations

import argparse
import sys

from tfxformer.decoding import DEFAULT_ALPHA, DEFAULT_BEAM_SIZE, DEFAULT_EXTRA_LENGTH
from tfxformer.serving.export import (
    export_run_dir,
    export_translator,
    load_saved_model_weights,
    make_translator,
)
from tfxformer.serving.loading import resolve_model_dir
from tfxformer.serving.translator import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_INPUT_TOKENS,
    DEFAULT_MAX_OUTPUT_TOKENS,
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python scripts/export.py",
        description="Export a trained run dir as a TF Serving SavedModel "
                    "<export-dir>/<version>/ (version: next integer), with warm-up records "
                    "and an example batching_parameters.txt in assets.extra/.")
    parser.add_argument("--model", required=True,
                        help="trained run dir (config.json, spm.model, checkpoints/), or a "
                             "SavedModel of this package (version dir or export dir: its "
                             "variables are re-exported with the current code)")
    parser.add_argument("--export-dir", required=True,
                        help="model base path for TF Serving, e.g. saved_models/en_de")
    parser.add_argument("--checkpoint", help="checkpoint prefix of a run dir (default: "
                        "newest, averaged ones first)")
    parser.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help="beam size of serving_default (default: %(default)s, §6.1)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="length penalty α of serving_default (default: %(default)s)")
    parser.add_argument("--max-extra-length", type=int, default=DEFAULT_EXTRA_LENGTH,
                        help="output tokens allowed beyond the source length (default: "
                             "%(default)s, §6.1)")
    parser.add_argument("--max-input-tokens", type=int,
                        help="source tokens kept, EOS included; longer inputs are cut and "
                             "flagged in the `truncated` output (default: the run's training "
                             f"max_length, else {DEFAULT_MAX_INPUT_TOKENS}; at most the "
                             "model's positions)")
    parser.add_argument("--max-output-tokens", type=int,
                        help="decode limit in tokens, EOS included, whatever the source "
                             "length (default: the run's training max_length, else "
                             f"{DEFAULT_MAX_OUTPUT_TOKENS}; at most the model's positions)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                        help="sentences decoded together inside the graph; also the "
                             "max_batch_size of batching_parameters.txt and the tuned "
                             "warm-up batch size (default: %(default)s)")
    parser.add_argument("--batch-threads", type=int,
                        help="num_batch_threads of batching_parameters.txt (default: this "
                             "machine's cores)")
    parser.add_argument("--version", type=int, help="version number (default: next free)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="compute type of the exported graph: bf16 is faster on CPUs "
                             "with AVX512-BF16 (weights stay float32) (default: %(default)s)")
    return parser


def export(args):
    """Exports as `args` says; returns the new version dir."""
    options = dict(beam_size=args.beam_size, alpha=args.alpha,
                   extra_length=args.max_extra_length, max_batch_size=args.batch_size,
                   max_input_tokens=args.max_input_tokens,
                   max_output_tokens=args.max_output_tokens)
    kind, path = resolve_model_dir(args.model)
    if kind == "run_dir":
        return export_run_dir(path, args.export_dir, checkpoint=args.checkpoint,
                              version=args.version, precision=args.precision,
                              num_batch_threads=args.batch_threads, **options)
    if args.checkpoint:
        raise ValueError(f"--checkpoint applies to a run dir; {args.model!r} is a SavedModel.")
    model, config, spm_bytes = load_saved_model_weights(path, precision=args.precision)
    translator = make_translator(model, config, spm_bytes, **options)
    return export_translator(translator, args.export_dir, config=config, version=args.version,
                             num_batch_threads=args.batch_threads)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        path = export(args)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
