"""Checkpoints named by global step, resuming, run-dir checks and checkpoint averaging (§6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints." (§6.1)
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import tensorflow as tf

log = logging.getLogger("tfxformer")

CHECKPOINTS, AVERAGED = "checkpoints", "averaged"
# Differences in these config entries make a run dir incompatible with a new command.
MODEL_KEYS_THAT_MUST_MATCH = ("model", "src", "tgt")


class Manager:
    """`tf.train.CheckpointManager` over model, optimizer and step, `ckpt-<step>` names.

    With `data_iterator` (a tf.data iterator) the input pipeline's position is saved too.
    The state file is written after a checkpoint's files, so a half-written checkpoint
    (a kill during the save) is never the one restored. Under MultiWorkerMirroredStrategy
    every worker saves (the save is collective) but only the chief into `model_dir`;
    the others write to a temporary folder that is removed at once.
    """

    def __init__(self, model_dir, model, optimizer, max_to_keep=20, chief=True,
                 data_iterator=None):
        state = dict(model=model, optimizer=optimizer)
        if data_iterator is not None:  # resume with the batches an unbroken run would see
            state["data"] = data_iterator
        self.checkpoint = tf.train.Checkpoint(**state)
        self.optimizer = optimizer
        self.chief = chief
        self.directory = os.path.join(model_dir, CHECKPOINTS)
        target = self.directory if chief else os.path.join(
            model_dir, f".worker-{os.getpid()}-tmp")
        self.manager = tf.train.CheckpointManager(self.checkpoint, target,
                                                  max_to_keep=max_to_keep,
                                                  checkpoint_name="ckpt")

    def restore_latest(self) -> int:
        """Restores the newest checkpoint in `checkpoints/`; returns its step (0 if none)."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            log.info("No checkpoint in %s: starting from step 0", self.directory)
            return 0
        try:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise ValueError(f"Checkpoint {latest} cannot be restored into this model, "
                             "optimizer and data pipeline (a different preset, vocabulary, "
                             "--batch-tokens or --max-length?): "
                             f"{str(error)[:400]}") from error
        step = int(self.optimizer.iterations.numpy())
        log.info("Resumed from %s at step %d", latest, step)
        return step

    def save(self, step: int) -> str:
        path = self.manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        else:
            log.info("Saved %s", path)
        return path


def check_compatible(path: str, record: dict) -> None:
    """Raises ValueError naming every entry where `record` differs from the config at `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read {path} ({error}); remove it or use a new --model-dir."
                         ) from error
    diffs = []
    for key in MODEL_KEYS_THAT_MUST_MATCH:
        old, new = existing.get(key), record.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            diffs += [f"{key}.{k}: {old.get(k)!r} in the run dir, {new.get(k)!r} now"
                      for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif old != new:
            diffs.append(f"{key}: {old!r} in the run dir, {new!r} now")
    if diffs:
        raise ValueError(f"The run dir's {path} does not match this command: "
                         + "; ".join(diffs) + ". Use the same settings to resume, or a new "
                         "--model-dir.")


def load_vocabulary(path: str):
    """Loads `spm.model` with a clear error for a missing or corrupt file."""
    from tfxformer.data.tokenizer import Tokenizer

    try:
        return Tokenizer.load(path)
    except FileNotFoundError:
        raise
    except Exception as error:  # SentencePiece raises several types for a bad proto
        raise ValueError(f"{path} is not a valid SentencePiece model ({error}); delete it to "
                         "train the vocabulary again, or use a new --model-dir.") from error


def average_checkpoints(model_dir: str, last: int = 5, output_dir: str | None = None) -> str:
    """Averages the model weights of the last `last` checkpoints into `averaged/ckpt-<step>`.

    Reads `model_dir/checkpoints`, writes a model-only checkpoint (the averaged weights;
    the optimizer state of an average has no meaning) that `tfxformer.serving` prefers.

    Returns:
        The path of the averaged checkpoint.
    """
    from tfxformer.models.transformer import Transformer
    from tfxformer.serving.loading import read_run_config

    state = tf.train.get_checkpoint_state(os.path.join(model_dir, CHECKPOINTS))
    if state is None or not state.all_model_checkpoint_paths:
        raise FileNotFoundError(f"No checkpoints to average in {model_dir}/{CHECKPOINTS}.")
    paths = list(state.all_model_checkpoint_paths)[-last:]
    if len(paths) < last:
        log.warning("Averaging %d checkpoints: only %d are kept", last, len(paths))
    model = Transformer(**read_run_config(model_dir)["model"])
    model.build()
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
        weights = [w.astype(np.float64) for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights, strict=True)]
    model.set_weights([(t / len(paths)).astype(np.float32) for t in total])
    step = int(os.path.basename(paths[-1]).split("-")[-1])
    out = output_dir or os.path.join(model_dir, AVERAGED)
    manager = tf.train.CheckpointManager(checkpoint, out, max_to_keep=3, checkpoint_name="ckpt")
    saved = manager.save(checkpoint_number=step)
    log.info("Averaged %d checkpoints (%s) into %s", len(paths),
             ", ".join(os.path.basename(p) for p in paths), saved)
    return saved
