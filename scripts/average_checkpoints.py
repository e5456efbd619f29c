"""Average the model weights of a run's last K checkpoints into <model-dir>/averaged/ (§6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints
... For the big models, we averaged the last 20 checkpoints."

    python scripts/average_checkpoints.py --model-dir runs/base --last 5

Export, `scripts/translate.py` and `scripts/evaluate.py` load the averaged checkpoint when a
run dir has one (tfxformer.rundir.find_checkpoint).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True,
                        help="run directory written by train_wmt.py (config.json, checkpoints/)")
    parser.add_argument("--last", type=int, default=5,
                        help="number of newest checkpoints to average (paper: 5 base, 20 big; "
                             "default: %(default)s)")
    parser.add_argument("--output-dir", help="where to write ckpt-<step> (default: "
                        "MODEL_DIR/averaged)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be >= 1, got {args.last}")
    import logging

    from tfxformer.checkpoints import average_checkpoints

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = average_checkpoints(args.model_dir, args.last, args.output_dir)
    except (OSError, ValueError) as error:  # missing, unreadable or mismatched files, named
        print(f"average_checkpoints.py: error: {error}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
