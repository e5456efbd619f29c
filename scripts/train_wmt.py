"""Train the Transformer (Vaswani et al., 2017) for translation; rerun the same command to resume.

Defaults are the paper's base model on WMT14 EN-DE (tensorflow-datasets), in the precision
chosen for the machine (--precision auto). Any tensorflow-datasets translation dataset is
--data tfds:NAME[/CONFIG]. Offline, point --data at a folder of aligned text files, e.g.
../shared/data/multi30k.

Examples:
  python scripts/train_wmt.py --model-dir runs/base                      # WMT14, base
  python scripts/train_wmt.py --data tfds:wmt14_translate/fr-en --src en --tgt fr \
      --model-dir runs/en_fr                                             # WMT14 EN-FR
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
import types
import typing

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfxformer.train_config import TrainConfig, settings_as_flags  # noqa: E402

# Fault injection for tests only: SIGKILL the process after the files of ckpt-<N> are
# written, before the state file names them (tfxformer.checkpoints.Manager).
KILL_AT_SAVE_ENV = "TFXFORMER_FAULT_KILL_AT_SAVE"
# ... and comma-separated update numbers whose first attempt gets a NaN loss and gradients.
NONFINITE_FAULT_ENV = "TFXFORMER_FAULT_NONFINITE_STEPS"


def _fault_settings() -> dict:
    """The fault-injection keywords of train_and_evaluate, from the environment (tests)."""
    kill, nonfinite = os.environ.get(KILL_AT_SAVE_ENV), os.environ.get(NONFINITE_FAULT_ENV, "")
    try:
        return dict(kill_at_save_step=int(kill) if kill else None,
                    nonfinite_fault_steps={int(p) for p in nonfinite.split(",") if p.strip()})
    except ValueError:
        raise ValueError(f"{KILL_AT_SAVE_ENV}={kill!r} / {NONFINITE_FAULT_ENV}={nonfinite!r}: "
                         "expected update numbers, e.g. '7' and '7,12'.") from None


def _flag_type(hint):
    """(argparse type, is a switch) of a TrainConfig type hint: int, `float | None`, bool..."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint, hint is bool


def parse_args(argv=None) -> TrainConfig:
    """TrainConfig from the command line: one flag per field, its help the field's."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        kind, switch = _flag_type(hints[field.name])
        help_text = settings_as_flags(field.metadata["help"])
        if switch:  # --xla; or --token-cache / --no-token-cache for a default-on switch
            action = argparse.BooleanOptionalAction if field.default else "store_true"
            parser.add_argument(flag, action=action, default=field.default, help=help_text)
        elif field.default is dataclasses.MISSING:
            parser.add_argument(flag, type=kind, required=True, help=help_text)
        else:  # a help that says its default itself is not given "(default: None)" too
            default = "" if "(default:" in help_text else " (default: %(default)s)"
            parser.add_argument(flag, type=kind, default=field.default,
                                choices=field.metadata["choices"], help=help_text + default)
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv=None) -> int:
    """Exit status: 0 done; 2 an error that a rerun of the same command repeats (settings,
    data, run dir, non-finite loss with --on-nonfinite stop); 3 a lost worker of a
    multi-worker run (rerun every worker: they resume from the last checkpoint)."""
    config = parse_args(argv)
    from tfxformer.training import WorkerLostError, train_and_evaluate

    try:
        metrics = train_and_evaluate(config, **_fault_settings())
    except WorkerLostError as error:
        print(f"train_wmt.py: error: {settings_as_flags(str(error))}", file=sys.stderr)
        return 3
    except (ValueError, OSError, RuntimeError, FloatingPointError) as error:
        print(f"train_wmt.py: error: {settings_as_flags(str(error))}", file=sys.stderr)
        return 2
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
