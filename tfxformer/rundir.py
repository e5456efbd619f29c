"""The run directory: its file names, its `config.json` record, its checkpoints.

Training writes a run dir; checkpoint averaging, export, translation, evaluation and the
plotting scripts read it, all through this module (building its model is
:func:`tfxformer.pretrained.load_run_dir`'s)::

    config.json        the run record, RECORD_KEYS below (written once, atomically)
    spm.model          the shared SentencePiece vocabulary (§5.1), its bytes `spm_bytes`
    checkpoints/       ckpt-<step> files and the state file `checkpoint` naming them
    averaged/          averaged weights ckpt-<step> (§6.1) and their state file
    logs/              TensorBoard scalars
    token_cache/       the training pairs' token ids (tfxformer.data.token_cache)
    train.log          the training log

One rule says which checkpoint is "the newest": the one a state file names
(:func:`latest_checkpoint`). TensorFlow writes a checkpoint's files, then
`tf.train.CheckpointManager` rewrites the state file to name it, so a checkpoint whose
files are complete but which no state file names (a save cut short by a kill) is neither
resumed nor loaded. For loading a model (:func:`find_checkpoint`), `averaged/` is
preferred to `checkpoints/`; resuming training reads `checkpoints/` only.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os

import tensorflow as tf

from tfxformer import multilingual
from tfxformer.config import DecodingOptions, ModelConfig
from tfxformer.ids import SPM_FILENAME

log = logging.getLogger("tfxformer")

CONFIG_FILENAME = "config.json"
CHECKPOINTS, AVERAGED = "checkpoints", "averaged"
_CHECKPOINT_SUBDIRS = (AVERAGED, CHECKPOINTS)  # for loading a model, in order of preference
_STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's state file in each of them
LOGS, TRAIN_LOG = "logs", "train.log"
__all__ = [
    "AVERAGED", "CHECKPOINTS", "CONFIG_FILENAME", "LOGS", "SPM_FILENAME", "TRAIN_LOG",
    "RunRecord", "find_checkpoint", "read_config", "read_spm_bytes", "restore",
    "untracked_weights",
]

# The schema of config.json: every key training writes, and what it holds. Readers accept
# records of older versions, which lack "preset", "vocabulary_sha256" or "train", and whose
# "model" names the position-table size "max_length" (ModelConfig.from_dict upgrades it).
RECORD_KEYS = {
    "model": "the model's settings (tfxformer.config.ModelConfig.to_dict())",
    "src": "source language code",
    "tgt": "target language code",
    "max_length": "training length filter: pairs longer than this (tokens) were dropped",
    "preset": "the model preset the run started from",
    "vocabulary_sha256": "SHA-256 of spm.model, to tell another vocabulary of the same size",
    "train": "every training setting (tfxformer.training.TrainConfig) of the run",
    "init_from": "the trained model the run started from (tfxformer.pretrained.init_record)",
}
# What an export adds to the record in its assets/config.json (tfxformer.serving.export).
# "ensemble": one entry per model of an ensemble export (its source, vocabulary, model);
# "precision_reason": why `--precision auto` chose its precision; "xla_max_batch": the
# largest chunk of the XLA-compiled search (tfxformer.serving.compiled; 0 off); "rerank":
# a reranking export's weights and rescoring models (tfxformer.serving.reranking);
# "signatures": the signatures it holds (scripts/export.py --signatures).
_EXPORT_KEYS = ("decoding", "precision", "compute_dtype", "shortlist", "ensemble",
                "precision_reason", "xla_max_batch", "rerank", "signatures", "input")
# Entries of the record that must match for a run dir to be resumed by a new command.
_MUST_MATCH = ("model", "src", "tgt", "vocabulary_sha256")
_CORRUPT = (tf.errors.OpError, IndexError, OSError)  # a truncated .data raises IndexError
_NEW_DIR = "restore it, or train into a new run dir (`model_dir`)"


def write_atomically(path: str, data: bytes) -> None:
    """Writes `path` through a temporary file and a rename: a kill leaves old or new."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


def make_record(model: ModelConfig, src: str, tgt: str, max_length: int, preset: str,
                spm_bytes: bytes, train: dict) -> dict:
    """The config.json record (RECORD_KEYS) of a run, as a JSON-ready dict."""
    return RunRecord(ModelConfig.from_dict(model), src, tgt, max_length, preset,
                     hashlib.sha256(spm_bytes).hexdigest(), dict(train)).to_dict()


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A run's config.json (RECORD_KEYS), or an export's assets/config.json (the run's
    record plus _EXPORT_KEYS), typed: :meth:`from_dict` reads any version of either.

    Attributes:
        model: the :class:`tfxformer.config.ModelConfig`.
        src, tgt: the language codes. max_length: the training length filter (None:
            not recorded). preset: the preset the run started from.
        vocabulary_sha256: SHA-256 of spm.model. train: every TrainConfig setting.
        decoding: an export's :class:`tfxformer.config.DecodingOptions` (None in a run dir).
        export: an export's precision, compute_dtype and shortlist record, and an ensemble
            export's members ("ensemble") ({} in a run dir).
        init_from: the trained model a fine-tuning run started from (path, kind, weights,
            vocabulary_sha256; :func:`tfxformer.pretrained.init_record`), or None.
    """

    model: ModelConfig
    src: str = "en"
    tgt: str = "de"
    max_length: int | None = None
    preset: str | None = None
    vocabulary_sha256: str | None = None
    train: dict = dataclasses.field(default_factory=dict)
    decoding: DecodingOptions | None = None
    export: dict = dataclasses.field(default_factory=dict)
    init_from: dict | None = None

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        """The record of `data` as any version wrote it: a model's old setting names, an
        export's old decoding names, and languages or length filter recorded only under
        "train" are upgraded here. Unknown keys raise ValueError."""
        unknown = sorted(set(data) - set(RECORD_KEYS) - set(_EXPORT_KEYS))
        if unknown:
            raise ValueError(f"Keys {unknown} are not part of the {CONFIG_FILENAME} record; "
                             f"accepted: {sorted(RECORD_KEYS) + sorted(_EXPORT_KEYS)}.")
        train = dict(data.get("train") or {})
        length = data.get("max_length", train.get("max_length"))
        decoding = data.get("decoding")
        return cls(
            model=ModelConfig.from_dict(data["model"]),
            src=data.get("src") or train.get("src") or "en",
            tgt=data.get("tgt") or train.get("tgt") or "de",
            max_length=length if isinstance(length, int) and not isinstance(length, bool)
            and length > 0 else None,
            preset=data.get("preset"), vocabulary_sha256=data.get("vocabulary_sha256"),
            train=train,
            decoding=None if decoding is None else DecodingOptions.from_dict(decoding),
            export={k: data[k] for k in _EXPORT_KEYS[1:] if k in data},
            init_from=data.get("init_from"))

    def to_dict(self) -> dict:
        """The JSON object config.json holds (entries not recorded are left out)."""
        out = {"model": self.model.to_dict(), "src": self.src, "tgt": self.tgt,
               "max_length": self.max_length, "preset": self.preset,
               "vocabulary_sha256": self.vocabulary_sha256, "train": dict(self.train),
               "init_from": self.init_from}
        out = {k: v for k, v in out.items() if v is not None and v != {}}
        if self.decoding is not None:
            out["decoding"] = self.decoding.to_dict()
        return {**out, **self.export}

    @property
    def target_languages(self) -> tuple[str, ...]:
        """A multilingual model's target languages (the run's `target_languages`), or ()
        for a model of one target language (:mod:`tfxformer.multilingual`)."""
        return multilingual.parse_languages(self.train.get("target_languages"))

    @property
    def reverse_target(self) -> bool:
        """Whether the model writes its targets right to left (the run's `reverse_target`):
        its output pieces are reversed before detokenizing, and a target it scores is
        reversed before scoring."""
        return bool(self.train.get("reverse_target", False))

    def training_data(self) -> str | None:
        """The run's training data (`train.data`: a text folder or "wmt14"), or None."""
        return self.train.get("data")


def write_config(run_dir: str, record: dict) -> str:
    """Writes `record` (:func:`make_record`) to `run_dir/config.json`; returns the path."""
    unknown = sorted(set(record) - set(RECORD_KEYS))
    if unknown:
        raise ValueError(f"Keys {unknown} are not part of the config.json record; accepted: "
                         f"{sorted(RECORD_KEYS)}.")
    path = os.path.join(run_dir, CONFIG_FILENAME)
    write_atomically(path, json.dumps(record, indent=2).encode("utf-8"))
    return path


def read_config(run_dir: str) -> dict:
    """Reads and checks `run_dir/config.json`; returns the record as written.

    Raises:
        FileNotFoundError: no config.json.
        ValueError: not JSON, not an object, or no "model" with a "vocab_size".
    """
    path = os.path.join(run_dir, CONFIG_FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {CONFIG_FILENAME} in run dir {run_dir!r}; expected the "
                                f"directory written by training ({CONFIG_FILENAME}, "
                                f"{SPM_FILENAME}, {CHECKPOINTS}/).")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read {path}: not valid JSON ({error}); it must be the "
                         f"record written by training: {_NEW_DIR}.") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not the object "
                         f"written by training: {_NEW_DIR}.")
    model = record.get("model")
    if not isinstance(model, dict) or "vocab_size" not in model:
        raise ValueError(f"{path} must hold {{'model': {{Transformer arguments with "
                         f"vocab_size}}, ...}}, got keys {sorted(record)!r}: {_NEW_DIR}.")
    return record


def check_compatible(run_dir: str, record: dict) -> None:
    """Raises ValueError naming every _MUST_MATCH entry where `record` differs from the
    run dir's config.json. An entry the existing record lacks (an older version) is not
    compared."""
    path = os.path.join(run_dir, CONFIG_FILENAME)
    existing = read_config(run_dir)
    diffs = []
    for key in _MUST_MATCH:
        if key not in existing and key == "vocabulary_sha256":
            continue
        old, new = existing.get(key), record.get(key)
        if key == "model":
            old, new = (ModelConfig.from_dict(m).to_dict() for m in (old, new))
            diffs += [f"{key}.{k}: {old.get(k)!r} in the run dir, {new.get(k)!r} now"
                      for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif key == "vocabulary_sha256" and old != new:
            diffs.append(f"{SPM_FILENAME} is not the vocabulary the run dir was trained with "
                         f"(SHA-256 {str(old)[:12]}... in {CONFIG_FILENAME}, "
                         f"{str(new)[:12]}... now)")
        elif old != new:
            diffs.append(f"{key}: {old!r} in the run dir, {new!r} now")
    old, new = (bool((r.get("train") or {}).get("reverse_target")) for r in (existing, record))
    if old != new:  # a model trained one way cannot go on the other
        diffs.append(f"train.reverse_target: {old!r} in the run dir, {new!r} now")
    if diffs:
        raise ValueError(f"The run dir's {path} does not match this command: "
                         + "; ".join(diffs) + ". Use the same settings to resume, or a new "
                         "run dir (`model_dir`).")


def read_spm_bytes(run_dir: str) -> bytes:
    """The bytes of `run_dir/spm.model`."""
    path = os.path.join(run_dir, SPM_FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {SPM_FILENAME} in run dir {run_dir!r}.")
    with open(path, "rb") as f:
        return f.read()


def _checkpoint_files(path: str) -> list[str]:
    """The files of checkpoint `path` (its .index and .data-* shards) that exist."""
    return sorted(glob.glob(glob.escape(path) + ".index")
                  + glob.glob(glob.escape(path) + ".data-*-of-*"))


def is_complete(path: str) -> bool:
    """Whether checkpoint `path` has its .index and at least one .data shard."""
    files = _checkpoint_files(path)
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
    state_path = os.path.join(directory, _STATE_FILE)
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
        raise ValueError(f"Checkpoint state file {state_path} is unreadable ({reason}): "
                         f"{_NEW_DIR}. It is not ignored, so that a run never silently "
                         "starts again from step 0.")
    latest = state.model_checkpoint_path
    if is_complete(latest):
        return latest
    if _checkpoint_files(latest):
        raise ValueError(
            f"Checkpoint {latest}, the latest that {state_path} names, is incomplete: only "
            f"{', '.join(_checkpoint_files(latest))} exist(s). Delete its files to resume "
            "from the previous checkpoint, or train into a new run dir (`model_dir`).")
    for path in reversed(state.all_model_checkpoint_paths):
        if is_complete(path):
            log.warning("Checkpoint %s named by %s has no files; resuming from (or loading) %s "
                        "instead",
                        latest, state_path, path)
            return path
    raise ValueError(f"None of the checkpoints that {state_path} names has its files "
                     f"({', '.join(state.all_model_checkpoint_paths)}). Delete {directory} "
                     "to start again from step 0, or train into a new run dir (`model_dir`).")


def find_checkpoint(run_dir: str) -> str | None:
    """The checkpoint a model is loaded from: the latest that `averaged/`'s state file
    names, else the latest of `checkpoints/` (:func:`latest_checkpoint`); None if none.
    An averaged checkpoint older than the newest of `checkpoints/` is still taken, with a
    warning naming the newer one."""
    folders = {d: os.path.join(run_dir, d) for d in _CHECKPOINT_SUBDIRS}
    averaged = latest_checkpoint(folders[AVERAGED]) if os.path.isdir(folders[AVERAGED]) \
        else None
    if averaged is None:
        trained = folders[CHECKPOINTS]
        return latest_checkpoint(trained) if os.path.isdir(trained) else None
    newest = describe_last_checkpoint(run_dir)  # never raises
    if is_complete(newest) and _step(newest) > _step(averaged):
        log.warning("Loading %s, averaged before the newer %s (training went on after "
                    "averaging); pass that checkpoint to load it instead.", averaged, newest)
    return averaged


def _step(path: str) -> int:
    tail = os.path.basename(path).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def describe_last_checkpoint(run_dir: str) -> str:
    """The newest training checkpoint of `run_dir`, for messages (never raises)."""
    try:
        path = latest_checkpoint(os.path.join(run_dir, CHECKPOINTS))
    except ValueError:
        path = None
    return path or "none yet (a rerun starts from step 0)"


def corrupt_error(path: str, error: Exception) -> ValueError:
    """The ValueError for checkpoint `path` whose files TensorFlow cannot read."""
    files = ", ".join(_checkpoint_files(path)) or f"{path}.*"
    reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error)
    return ValueError(f"Checkpoint {path} is corrupt or truncated ({reason}). Its files: "
                      f"{files}. Delete them to resume from the previous checkpoint, or "
                      "train into a new run dir (`model_dir`).")


def restore(checkpoint: tf.train.Checkpoint, path: str, what: str) -> None:
    """Reads `path` into `checkpoint`'s objects; every object must get its values.

    Raises:
        ValueError: the files are corrupt or truncated, or they do not fit the objects
            (`what` names them), each with the checkpoint's files named.
    """
    try:
        # read(), unlike restore(), adds no save_counter of its own to be matched.
        checkpoint.read(path).expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError) as error:
        raise ValueError(f"Checkpoint {path} does not match {what} (a different preset or "
                         f"vocabulary?): {str(error)[:400]}") from None
    except _CORRUPT as error:
        raise corrupt_error(path, error) from None


def hidden_model_variables(model) -> list:
    """The model's variables that `tf.train.Checkpoint(model=model)` does not reach.

    Keras 3 keeps its dropout `SeedGenerator` states out of the layers' tracked
    children; training saves them next to the model so that a resumed run continues
    the dropout random stream instead of restarting it.
    """
    root = tf.train.Checkpoint(model=model)  # TrackableView holds it by a weak reference
    reached = {id(t) for t in tf.train.TrackableView(root).descendants()}
    return [v for v in model.variables if id(v) not in reached]


def untracked_weights(model) -> list[str]:
    """Paths of the model weights that `tf.train.Checkpoint(model=model)` does not reach,
    and so neither saves nor restores (e.g. sublayers kept in a Python list under
    Keras 3, keras-team/keras#18398)."""
    hidden = {id(v) for v in hidden_model_variables(model)}
    return [w.path for w in model.weights if id(w) in hidden]
