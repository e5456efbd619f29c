"""Checkpoints named by global step, resuming, run-dir checks and checkpoint averaging (§6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints,
which were written at 10-minute intervals. For the big models, we averaged the last 20
checkpoints." (§6.1)

Crash safety: TensorFlow writes a checkpoint's files under temporary names, renames them
into place, and only then does `tf.train.CheckpointManager` rewrite the state file
`checkpoints/checkpoint` (itself written to a temporary file and renamed). The state file
is the commit point: a checkpoint it does not name (a save cut short by a kill) is never
restored, and one it names but that is missing, incomplete or corrupt stops the run with
an error naming its files instead of silently starting again from step 0.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import signal
import tempfile

import numpy as np
import tensorflow as tf

from tfxformer.config import renamed_model_arguments

log = logging.getLogger("tfxformer")

CHECKPOINTS, AVERAGED = "checkpoints", "averaged"
STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's state file in checkpoints/
# Differences in these config entries make a run dir incompatible with a new command.
MODEL_KEYS_THAT_MUST_MATCH = ("model", "src", "tgt", "vocabulary_sha256")
# Fault injection for tests only: SIGKILL this process after the files of ckpt-<step> are
# written, before the state file names them (the narrowest window of a save).
KILL_AT_SAVE_ENV = "TFXFORMER_FAULT_KILL_AT_SAVE"
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
    """

    def __init__(self, model_dir, model, optimizer, max_to_keep=20, chief=True,
                 data_iterator=None, data_settings=None):
        self.model, self.optimizer, self.chief = model, optimizer, chief
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
        if os.environ.get(KILL_AT_SAVE_ENV) == str(step):
            options = tf.train.CheckpointOptions(experimental_write_callbacks=[_kill_self])
        path = self.manager.save(checkpoint_number=step, options=options)
        if not self.chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
        else:
            log.info("Saved %s", path)
        return path


def _kill_self(save_path):
    log.warning("%s: killing this process after writing %s", KILL_AT_SAVE_ENV, save_path)
    os.kill(os.getpid(), signal.SIGKILL)


def hidden_model_variables(model) -> list:
    """The model's variables that `tf.train.Checkpoint(model=model)` does not reach.

    Keras 3 keeps its dropout `SeedGenerator` states out of the layers' tracked
    children; they are saved next to the model so that a resumed run continues the
    dropout random stream instead of restarting it.
    """
    root = tf.train.Checkpoint(model=model)  # TrackableView holds it by a weak reference
    reached = {id(t) for t in tf.train.TrackableView(root).descendants()}
    return [v for v in model.variables if id(v) not in reached]


def _dict_diff(old: dict, new: dict) -> str:
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
                     for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))


def checkpoint_files(path: str) -> list[str]:
    """The files of checkpoint `path` (its .index and .data-* shards) that exist."""
    return sorted(glob.glob(glob.escape(path) + ".index")
                  + glob.glob(glob.escape(path) + ".data-*-of-*"))


def _is_complete(path: str) -> bool:
    files = checkpoint_files(path)
    return any(f.endswith(".index") for f in files) and any(".data-" in f for f in files)


def latest_checkpoint(directory: str) -> str | None:
    """The newest checkpoint that `directory/checkpoint` (the state file) names.

    Checkpoints the state file does not name (a save cut short) are ignored. When the
    named latest has no file at all (deleted by hand), the newest complete earlier one
    the state file lists is used, with a warning.

    Raises:
        ValueError: the state file is unreadable, or a named checkpoint is incomplete,
            or none of the named checkpoints has its files.
    """
    state_path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(state_path):
        strays = sorted(glob.glob(os.path.join(glob.escape(directory), "ckpt-*.index")))
        if strays:
            log.warning("Ignoring %s: no state file %s names them (a save cut short?)",
                        ", ".join(strays), state_path)
        return None
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (ValueError, UnicodeDecodeError) as error:
        state, reason = None, error
    else:
        reason = "not a CheckpointState text proto"
    if state is None or not state.model_checkpoint_path:
        raise ValueError(f"Checkpoint state file {state_path} is unreadable ({reason}). "
                         "Restore it, or use a new --model-dir; it is not ignored, so that a "
                         "run never silently starts again from step 0.")
    latest = state.model_checkpoint_path
    if _is_complete(latest):
        return latest
    if checkpoint_files(latest):
        raise ValueError(
            f"Checkpoint {latest}, the latest that {state_path} names, is incomplete: only "
            f"{', '.join(checkpoint_files(latest))} exist(s). Delete its files to resume "
            "from the previous checkpoint, or use a new --model-dir.")
    for path in reversed(state.all_model_checkpoint_paths):
        if _is_complete(path):
            log.warning("Checkpoint %s named by %s has no files; resuming from %s instead",
                        latest, state_path, path)
            return path
    raise ValueError(f"None of the checkpoints that {state_path} names has its files "
                     f"({', '.join(state.all_model_checkpoint_paths)}). Delete {directory} "
                     "to start again from step 0, or use a new --model-dir.")


def _variable_names(path: str) -> set[str]:
    try:
        return set(tf.train.load_checkpoint(path).get_variable_to_shape_map())
    except _CORRUPT as error:
        raise _corrupt_error(path, error) from error


def _read_string(path: str, key: str) -> str:
    try:
        return tf.train.load_checkpoint(path).get_tensor(key).decode()
    except _CORRUPT as error:
        raise _corrupt_error(path, error) from error


def _corrupt_error(path: str, error: Exception) -> ValueError:
    files = ", ".join(checkpoint_files(path)) or f"{path}.*"
    reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error)
    return ValueError(f"Checkpoint {path} is corrupt or truncated ({reason}). Its files: "
                      f"{files}. Delete them to resume from the previous checkpoint, or use "
                      "a new --model-dir.")


def restore(checkpoint: tf.train.Checkpoint, path: str, what: str) -> None:
    """Reads `path` into `checkpoint`'s objects; every object must get its values.

    Raises:
        ValueError: the files are corrupt or truncated, or they do not fit the objects
            (`what` names them), each with the checkpoint's files named.
    """
    try:
        checkpoint.read(path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError) as error:
        raise ValueError(f"Checkpoint {path} cannot be restored into {what} (a different "
                         f"preset or vocabulary?): {str(error)[:400]}") from error
    except _CORRUPT as error:
        raise _corrupt_error(path, error) from error


def describe_last_checkpoint(model_dir: str) -> str:
    """The newest checkpoint of `model_dir` for messages (never raises)."""
    try:
        path = latest_checkpoint(os.path.join(model_dir, CHECKPOINTS))
    except ValueError:
        path = None
    return path or "none yet (a rerun starts from step 0)"


def write_atomically(path: str, data: bytes) -> None:
    """Writes `path` through a temporary file and a rename: a kill leaves old or new."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def check_compatible(path: str, record: dict) -> None:
    """Raises ValueError naming every entry where `record` differs from the config at `path`.

    An entry that the existing config does not have (written by an older version) is
    not compared.
    """
    try:
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read {path} ({error}); it must be the JSON written by "
                         "training. Restore it, or use a new --model-dir.") from error
    if not isinstance(existing, dict):
        raise ValueError(f"{path} holds a JSON {type(existing).__name__}, not the object "
                         "written by training. Restore it, or use a new --model-dir.")
    if isinstance(existing.get("model"), dict):  # written before a model argument's rename
        existing["model"] = renamed_model_arguments(existing["model"])
    diffs = []
    for key in MODEL_KEYS_THAT_MUST_MATCH:
        if key not in existing and key == "vocabulary_sha256":
            continue
        old, new = existing.get(key), record.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            diffs += [f"{key}.{k}: {old.get(k)!r} in the run dir, {new.get(k)!r} now"
                      for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif key == "vocabulary_sha256" and old != new:
            diffs.append(f"spm.model is not the vocabulary the run dir was trained with "
                         f"(SHA-256 {str(old)[:12]}... in config.json, {str(new)[:12]}... now)")
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
        raise ValueError(f"{path} is not a valid SentencePiece model ({error}); restore it, "
                         "or use a new --model-dir.") from error


def average_checkpoints(model_dir: str, last: int = 5, output_dir: str | None = None) -> str:
    """Averages the model weights of the last `last` checkpoints into `averaged/ckpt-<step>`.

    Reads `model_dir/checkpoints`, writes a model-only checkpoint (the averaged weights;
    the optimizer state of an average has no meaning) that `tfxformer.serving` prefers.
    Checkpoints the state file lists but whose files are gone (a kill while old ones were
    being deleted) are left out.

    Returns:
        The path of the averaged checkpoint.
    """
    from tfxformer.models.transformer import Transformer
    from tfxformer.serving.loading import read_run_config

    directory = os.path.join(model_dir, CHECKPOINTS)
    latest_checkpoint(directory)  # a clear error for an unreadable state file
    state = tf.train.get_checkpoint_state(directory)
    listed = list(state.all_model_checkpoint_paths) if state else []
    paths = [p for p in listed if _is_complete(p)][-last:]
    if not paths:
        raise FileNotFoundError(f"No checkpoints to average in {directory}.")
    if len(paths) < last:
        log.warning("Averaging %d checkpoints: only %d are kept", last, len(paths))
    model = Transformer(**read_run_config(model_dir)["model"])
    model.build()
    checkpoint = tf.train.Checkpoint(model=model)
    total = None
    for path in paths:
        restore(checkpoint, path, "the model of config.json")
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
