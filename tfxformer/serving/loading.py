"""Finding and loading what training and export wrote: run dirs and SavedModel versions.

A trained run dir holds `config.json` ({"model": Transformer kwargs, "src", "tgt",
"max_length", ...}), `spm.model`, and checkpoints `checkpoints/ckpt-<step>` (averaged ones,
preferred, in `averaged/ckpt-<step>`). An export dir holds SavedModels in integer version
subdirectories `<export-dir>/<version>/saved_model.pb`, as TF Serving expects.
"""

from __future__ import annotations

import json
import os
import re

import tensorflow as tf

from tfxformer.checkpoints import hidden_model_variables
from tfxformer.config import PRECISION_POLICIES

CONFIG_FILENAME = "config.json"
SPM_FILENAME = "spm.model"
CHECKPOINT_SUBDIRS = ("averaged", "checkpoints")  # in order of preference
_CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


def read_run_config(model_dir):
    """Reads and checks `<model_dir>/config.json`; returns the dict."""
    path = os.path.join(model_dir, CONFIG_FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {CONFIG_FILENAME} in run dir {model_dir!r}; expected the "
                                "directory written by training (config.json, spm.model, "
                                "checkpoints/).")
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict) or "vocab_size" not in model:
        got = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"{path} must hold {{'model': {{Transformer kwargs with vocab_size}}, "
                         f"...}}, got {got!r}.")
    return config


def find_checkpoint(model_dir):
    """Path prefix of the newest checkpoint, averaged ones first (`averaged/`, then
    `checkpoints/`); None when there is none."""
    for subdir in CHECKPOINT_SUBDIRS:
        folder = os.path.join(model_dir, subdir)
        if not os.path.isdir(folder):
            continue
        steps = [int(m.group(1)) for m in map(_CHECKPOINT_INDEX.match, os.listdir(folder)) if m]
        if steps:
            return os.path.join(folder, f"ckpt-{max(steps)}")
        latest = tf.train.latest_checkpoint(folder)  # other prefixes, via the state file
        if latest:
            return latest
    return None


def load_run_dir(model_dir, checkpoint=None, precision="fp32"):
    """Loads a trained run dir into `(model, config, spm_bytes)`.

    Builds :class:`tfxformer.Transformer` from `config["model"]` and restores the model
    weights of `checkpoint` (default: :func:`find_checkpoint`), checking that every model
    weight is restored; optimizer and step entries are ignored. `precision` "bf16" or
    "fp16" computes in that type (float32 weights, logits, softmax and LayerNorm).

    Raises:
        FileNotFoundError: no config.json, spm.model or checkpoint.
        ValueError: an unreadable config, or a checkpoint that does not fit the model.
    """
    from tfxformer.models.transformer import Transformer

    if precision not in PRECISION_POLICIES:
        raise ValueError(f"precision {precision!r} not in {sorted(PRECISION_POLICIES)}.")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"Run dir {model_dir!r} does not exist.")
    config = read_run_config(model_dir)
    spm_path = os.path.join(model_dir, SPM_FILENAME)
    if not os.path.isfile(spm_path):
        raise FileNotFoundError(f"No {SPM_FILENAME} in run dir {model_dir!r}.")
    with open(spm_path, "rb") as f:
        spm_bytes = f.read()
    checkpoint = checkpoint or find_checkpoint(model_dir)
    if checkpoint is None:
        raise FileNotFoundError(
            f"No checkpoint in run dir {model_dir!r}: looked for ckpt-<step> in "
            f"{', '.join(f'{d}/' for d in CHECKPOINT_SUBDIRS)}.")
    model = Transformer(**config["model"], dtype=PRECISION_POLICIES[precision])
    model.build()
    _restore(model, checkpoint)
    return model, config, spm_bytes


def untracked_weights(model):
    """Paths of the model weights that `tf.train.Checkpoint(model=model)` does not reach,
    and so neither saves nor restores (e.g. sublayers kept in a Python list under
    Keras 3, keras-team/keras#18398)."""
    hidden = {id(v) for v in hidden_model_variables(model)}
    return [w.path for w in model.weights if id(w) in hidden]


def _restore(model, checkpoint):
    """Restores the model weights of `checkpoint`, all of them or raises ValueError."""
    untracked = untracked_weights(model)
    if untracked:
        raise ValueError(
            f"{len(untracked)} of {len(model.weights)} model weights are not tracked by "
            f"tf.train.Checkpoint (e.g. {untracked[:3]}), so checkpoint {checkpoint!r} can "
            "neither hold nor restore them; the model's layer tracking must be fixed.")
    try:
        # read(), unlike restore(), adds no save_counter of its own to be matched.
        status = tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        raise ValueError(f"Checkpoint {checkpoint!r} does not match the model of "
                         f"{CONFIG_FILENAME}: {str(err)[:500]}") from None


def saved_model_versions(export_dir):
    """Sorted integer versions `v` with `<export_dir>/<v>/saved_model.pb`."""
    if not os.path.isdir(export_dir):
        return []
    return sorted(int(name) for name in os.listdir(export_dir) if name.isdigit()
                  and os.path.isfile(os.path.join(export_dir, name, "saved_model.pb")))


def resolve_model_dir(path):
    """Says what `path` is: ("saved_model", version dir) for a SavedModel directory or an
    export dir (its highest version), or ("run_dir", path) for a trained run dir.

    Raises:
        FileNotFoundError: `path` is none of these, with what was expected.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Model dir {path!r} does not exist (or is not a directory).")
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return "saved_model", path
    versions = saved_model_versions(path)
    if versions:
        return "saved_model", os.path.join(path, str(versions[-1]))
    if os.path.isfile(os.path.join(path, CONFIG_FILENAME)):
        return "run_dir", path
    raise FileNotFoundError(
        f"{path!r} is not a model dir. Accepted: a SavedModel version dir (with "
        "saved_model.pb), an export dir with integer version subdirs, or a trained run dir "
        f"(with {CONFIG_FILENAME}, {SPM_FILENAME} and checkpoints/).")
