"""Train the Transformer (Vaswani et al., 2017) for translation; rerun the same command to resume.

Defaults are the paper's base model on WMT14 EN-DE (tensorflow-datasets). Offline, point
--data at a folder of aligned text files, e.g. ../shared/data/multi30k.

Examples:
  python scripts/train_wmt.py --model-dir runs/base                      # WMT14, base
  python scripts/train_wmt.py --data ../shared/data/multi30k --preset tiny \\
      --vocab-size 2000 --batch-tokens 2048 --train-steps 200 --cpu-devices 2 \\
      --model-dir runs/tiny --export-dir saved_models/tiny

Exit status: 0 done; 2 an error naming what to fix; 3 a worker of a multi-worker run was
lost (restart every worker with the same command to resume from the last checkpoint).
"""

import argparse
import dataclasses
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfxformer.config import PRESETS  # noqa: E402
from tfxformer.training import PRECISIONS, TrainConfig  # noqa: E402

HELP = {
    "model_dir": "run directory: config.json, spm.model, checkpoints/, logs/ (TensorBoard), "
                 "train.log. Rerunning with the same directory resumes from its latest "
                 "checkpoint",
    "data": "'wmt14' (tensorflow-datasets wmt14_translate/de-en) or a folder with "
            "train.SRC/train.TGT and val.SRC/val.TGT text files (.gz accepted)",
    "src": "source language code (file suffix)",
    "tgt": "target language code (file suffix)",
    "preset": f"model preset: {', '.join(PRESETS)} (base and big are the paper's Table 3)",
    "vocab_size": "shared SentencePiece BPE vocabulary size (paper: about 37000 for EN-DE)",
    "dropout": "override the preset's dropout P_drop (paper: 0.1 base, 0.3 big)",
    "max_length": "drop training pairs longer than this many tokens (either side)",
    "batch_tokens": "padded tokens per side in one global step, over all replicas (paper: "
                    "25000 source + 25000 target)",
    "accumulation_steps": "global steps whose gradients make one update (reach a token "
                          "budget larger than memory allows)",
    "train_steps": "number of updates (paper: 100000 base, 300000 big)",
    "warmup_steps": "linear warmup of the learning rate (paper: 4000)",
    "lr_scale": "factor on the paper's learning-rate schedule",
    "label_smoothing": "label smoothing epsilon (paper: 0.1)",
    "checkpoint_every": "save a checkpoint ckpt-<step> every this many updates",
    "keep_checkpoints": "checkpoints kept on disk",
    "average_last": "at the end, average the last K checkpoints into averaged/ (paper: 5 "
                    "base, 20 big; 0 or 1 = no averaging)",
    "eval_every": "validation loss and BLEU every this many updates (0 = never)",
    "eval_sentences": "validation sentences translated for BLEU (0 = loss only)",
    "beam_size": "beam size for validation BLEU and the export (paper: 4)",
    "alpha": "length penalty alpha for validation BLEU and the export (paper: 0.6)",
    "log_every": "log loss, learning rate and tokens/s every this many updates",
    "cpu_devices": "split the CPU into N logical devices so MirroredStrategy runs N "
                   "replicas on a machine without GPUs",
    "precision": f"{'/'.join(PRECISIONS)}: float32, mixed bfloat16 (CPU/TPU), or mixed "
                 "float16 with loss scaling (GPU)",
    "xla": "compile the training step with XLA",
    "seed": "random seed (data order, vocabulary sampling)",
    "shuffle_buffer": "training pairs in the shuffle buffer",
    "on_nonfinite": "on a NaN/Inf loss or gradient: 'skip' the update or 'stop' training",
    "deterministic": "enable TensorFlow op determinism (slower; reproducible runs)",
    "export_dir": "at the end, export the translator SavedModel to EXPORT_DIR/<version>/",
    "tfds_data_dir": "tensorflow-datasets data directory for --data wmt14",
    "tfds_manual_dir": "tensorflow-datasets manual download directory for --data wmt14",
}


def parse_args(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        help_text = HELP[field.name]
        if field.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        kind = {"int": int, "float": float, "str": str, "int | None": int,
                "float | None": float, "str | None": str}[str(field.type)]
        if field.default is dataclasses.MISSING:
            parser.add_argument(flag, type=kind, required=True, help=help_text)
        else:
            choices = {"precision": PRECISIONS, "on_nonfinite": ("skip", "stop"),
                       "preset": tuple(PRESETS)}.get(field.name)
            parser.add_argument(flag, type=kind, default=field.default, choices=choices,
                                help=f"{help_text} (default: %(default)s)")
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv=None) -> int:
    """Exit status: 0 done; 2 an error that a rerun of the same command repeats (settings,
    data, run dir, non-finite loss with --on-nonfinite stop); 3 a lost worker of a
    multi-worker run (rerun every worker: they resume from the last checkpoint)."""
    config = parse_args(argv)
    from tfxformer.trainer import nonfinite_fault_steps
    from tfxformer.training import WorkerLostError, train_and_evaluate

    try:
        metrics = train_and_evaluate(config, nonfinite_fault_steps=nonfinite_fault_steps())
    except WorkerLostError as error:
        print(f"train_wmt.py: error: {error}", file=sys.stderr)
        return 3
    except (ValueError, OSError, RuntimeError, FloatingPointError) as error:
        print(f"train_wmt.py: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
