"""Checkpoints of training named by global step, resuming, and checkpoint averaging (§6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints." (§6.1)

Crash safety: TensorFlow writes a checkpoint's files under temporary names, renames them
into place, and only then does `tf.train.CheckpointManager` rewrite the state file
`checkpoints/checkpoint` (itself written to a temporary file and renamed). The state file
is the commit point: a checkpoint it does not name (a save cut short by a kill) is never
restored, and one it names but that is missing, incomplete or corrupt stops the run with
an error naming its files instead of silently starting again from step 0. That rule,
and the run dir's layout, are :mod:`tfxformer.rundir`'s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile

import numpy as np
import tensorflow as tf

from tfxformer import pretrained, rundir
from tfxformer.models.transformer import Transformer
from tfxformer.rundir import (  # noqa: F401 (describe_last_checkpoint: for messages)
    AVERAGED,
    CHECKPOINTS,
    corrupt_error,
    describe_last_checkpoint,
    hidden_model_variables,
    is_complete,
    latest_checkpoint,
    restore,
)

log = logging.getLogger("tfxformer")

_SETTINGS_KEY = "settings/.ATTRIBUTES/VARIABLE_VALUE"
_CORRUPT = (tf.errors.OpError, IndexError, OSError)  # a truncated .data raises IndexError


class Manager:
    """`tf.train.CheckpointManager` over model, optimizer and step, `ckpt-<step>` names.

    Each checkpoint holds the model weights, the model variables Keras hides from
    `tf.train.Checkpoint` (the dropout seed generators: without them a resumed run draws
    the dropout masks of step 0 again), the optimizer state, and with `data_iterator` (a
    tf.data iterator) the input pipeline's position and, as `settings`, `data_settings`
    (a dict of the settings that shape the pipeline). A checkpoint whose pipeline settings
    differ from `data_settings` restores model and optimizer only: the pipeline starts
    afresh, with a warning (restoring one pipeline's position into another can hang
    tf.data).

    Under MultiWorkerMirroredStrategy every worker saves (the save is collective) but only
    the chief into `model_dir`; the others write to a local temporary folder removed at
    once.

    `kill_at_save_step` (fault injection, for tests only): SIGKILL this process after the
    files of `ckpt-<kill_at_save_step>` are written, before the state file names them, the
    narrowest window of a save. Only scripts set it (scripts/train_wmt.py reads it from the
    environment).
    """

    def __init__(self, model_dir, model, optimizer, max_to_keep=20, chief=True,
                 data_iterator=None, data_settings=None, kill_at_save_step=None):
        self.model, self.optimizer, self.chief = model, optimizer, chief
        self.kill_at_save_step = kill_at_save_step
        self.model_state = hidden_model_variables(model)
        self.data_iterator = data_iterator
        self.data_settings = json.dumps(data_settings or {}, sort_keys=True)
        self._settings_variable = tf.Variable(self.data_settings, trainable=False)
        self.checkpoint = tf.train.Checkpoint(settings=self._settings_variable,
                                              **self._objects(with_data=True, with_state=True))
        self.directory = os.path.join(model_dir, CHECKPOINTS)
        self.latest = latest_checkpoint(self.directory)  # before the manager reads the state
        target = self.directory if chief else tempfile.mkdtemp(prefix="tfxformer-worker-")
        self.manager = tf.train.CheckpointManager(self.checkpoint, target,
                                                  max_to_keep=max_to_keep,
                                                  checkpoint_name="ckpt")
        if not chief:  # each save writes it again, then removes it
            shutil.rmtree(target, ignore_errors=True)

    def _objects(self, with_data: bool, with_state: bool) -> dict:
        objects = dict(model=self.model, optimizer=self.optimizer)
        if with_state and self.model_state:
            objects["model_state"] = self.model_state
        if with_data and self.data_iterator is not None:
            objects["data"] = self.data_iterator
        return objects

    def restore_latest(self) -> int:
        """Restores the newest checkpoint the state file names; returns its step (0 if none).

        Raises:
            ValueError: the state file is unreadable, or the checkpoint it names is
                incomplete, corrupt, or does not fit this model and optimizer.
        """
        latest = self.latest
        if latest is None:
            log.info("No checkpoint in %s: starting from step 0", self.directory)
            return 0
        names = _variable_names(latest)
        with_data = self.data_iterator is not None and "data/.ATTRIBUTES/ITERATOR_STATE" in names
        if with_data and _SETTINGS_KEY in names:
            saved = _read_string(latest, _SETTINGS_KEY)
            if saved != self.data_settings:
                log.warning("The input pipeline settings differ from those of %s (%s): model "
                            "and optimizer resume, the data pipeline starts afresh.", latest,
                            _dict_diff(json.loads(saved), json.loads(self.data_settings)))
                with_data = False
        with_state = any(name.startswith("model_state/") for name in names)
        objects = self._objects(with_data, with_state)
        restore(tf.train.Checkpoint(**objects), latest, "this model, optimizer and data pipeline")
        step = int(self.optimizer.iterations.numpy())
        log.info("Resumed from %s at step %d", latest, step)
        return step

    def save(self, step: int) -> str:
        options = None
        if self.kill_at_save_step is not None and step == self.kill_at_save_step:
            options = tf.train.CheckpointOptions(experimental_write_callbacks=[_kill_self])
        path = self.manager.save(checkpoint_number=step, options=options)
        if not self.chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        else:
            log.info("Saved %s", path)
        return path


def _kill_self(save_path):
    log.warning("Fault injection (kill at save): killing this process after writing %s",
                save_path)
    os.kill(os.getpid(), signal.SIGKILL)


def _dict_diff(old: dict, new: dict) -> str:
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
                     for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))


def _variable_names(path: str) -> set[str]:
    try:
        return set(tf.train.load_checkpoint(path).get_variable_to_shape_map())
    except _CORRUPT as error:
        raise corrupt_error(path, error) from error


def _read_string(path: str, key: str) -> str:
    try:
        return tf.train.load_checkpoint(path).get_tensor(key).decode()
    except _CORRUPT as error:
        raise corrupt_error(path, error) from error


def average_checkpoints(model_dir: str, last: int = 5, output_dir: str | None = None) -> str:
    """Averages the model weights of the last `last` checkpoints into `averaged/ckpt-<step>`.

    Reads `model_dir/checkpoints`, writes a model-only checkpoint (the averaged weights;
    the optimizer state of an average has no meaning) that `tfxformer.serving` prefers.
    Checkpoints the state file lists but whose files are gone (a kill while old ones were
    being deleted) are left out.

    Returns:
        The path of the averaged checkpoint.
    """
    directory = os.path.join(model_dir, CHECKPOINTS)
    latest_checkpoint(directory)  # a clear error for an unreadable state file
    state = tf.train.get_checkpoint_state(directory)
    listed = list(state.all_model_checkpoint_paths) if state else []
    paths = [p for p in listed if is_complete(p)][-last:]
    if not paths:
        raise FileNotFoundError(f"No checkpoints to average in {directory}.")
    if len(paths) < last:
        log.warning("Averaging %d checkpoints: only %d are kept", last, len(paths))
    model = pretrained.build(Transformer, rundir.read_config(model_dir)["model"])
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        restore(checkpoint, path, f"the model of {rundir.CONFIG_FILENAME}")
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
