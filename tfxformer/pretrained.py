"""From a trained model to your own data: load, save and fine-tune trained Transformers.

A trained model of this package is any of (:mod:`tfxformer.locate` tells which):

* a SavedModel export (``saved_models/<name>``, its highest version is taken) or one of its
  version dirs (``saved_models/<name>/<N>``), as ``scripts/export.py`` and training's
  ``--export-dir`` write them;
* a run dir of ``scripts/train_wmt.py``: its averaged checkpoint first, else its latest
  (the choice ``scripts/translate.py`` makes, :func:`tfxformer.rundir.find_checkpoint`);
* a preset dir written by :meth:`tfxformer.Transformer.save_to_preset` (the keras-hub
  layout: ``config.json``, ``model.weights.h5``, ``spm.model``, ``metadata.json``).

The functions here build whichever class they are handed (keras-hub's
``load_backbone(cls, ...)``): ``Transformer.from_preset``, ``save_to_preset`` and
``Tokenizer.from_preset`` are thin methods over them, and this module imports neither
class.

In Keras::

    import tfxformer
    from tfxformer.data import Tokenizer

    model = tfxformer.Transformer.from_preset("saved_models/multi30k_en_de")  # weights too
    tokenizer = Tokenizer.from_preset("saved_models/multi30k_en_de")  # the same ids
    model.compile(optimizer=tfxformer.paper_adam(
                      tfxformer.TransformerSchedule(128, warmup_steps=500)),
                  loss=tfxformer.LabelSmoothedCrossEntropy(0.1))
    model.fit(dataset, epochs=1)      # ((source_ids, decoder_input_ids), labels) batches
    model.save_to_preset("runs/adapted")  # with the vocabulary it was loaded with
    again = tfxformer.Transformer.from_preset("runs/adapted")

``from_preset(path, **overrides)`` takes model arguments that change no weight's shape
(``dropout=0.2`` for fine-tuning, ``dtype="mixed_bfloat16"``); one that does is an error
naming the weight and both shapes. A ``vocab_size`` other than the model's is an error.

With ``scripts/train_wmt.py``, ``--init-from PATH`` (the same kinds of path) starts a new
run from a trained model::

    python scripts/train_wmt.py --init-from saved_models/multi30k_en_de \\
        --data DIR --model-dir runs/adapted --train-steps 2000 --warmup-steps 200 \\
        --batch-tokens 4096 --export-dir saved_models/adapted

The model settings (architecture, position table) and the vocabulary (its ``spm.model``,
byte for byte) are the source's; its weights are loaded; the optimizer and the
learning-rate schedule start fresh (``--warmup-steps``, ``--lr-scale`` as given). A
``--preset``, ``--vocab-size`` or ``--max-positions`` that differs from the source's is an
error naming both values; a setting left at its default is not compared. ``--dropout``
may be set: it changes no weight, and fine-tuning on little data often wants more (or
less) of it than the source was trained with. The run dir is a run dir like any other:
checkpoints, rerunning the same command to resume (its own latest checkpoint wins over
``--init-from``, which must still exist), averaging and export; its ``config.json``
records ``init_from``: the path, its kind, the weights read and the source's vocabulary
SHA-256.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import logging
import os

import sentencepiece as spm

from tfxformer import rundir
from tfxformer.config import PRECISION_POLICIES, PRESETS, ModelConfig, get_preset
from tfxformer.locate import (
    KINDS,
    METADATA_FILENAME,
    ONE_MODEL,
    REGISTERED_NAME,
    WEIGHTS_FILENAME,
    Loader,
    resolve,
)
from tfxformer.multilingual import parse_languages as multilingual_parse
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME
from tfxformer.weights import (  # noqa: F401 (public here too: what a model is read with)
    assign_weights,
    build,
    saved_model_variables,
    weight_key,
)

__all__ = ["build", "load_model", "load_run_dir", "load_saved_model_weights", "load_source",
           "load_tokenizer", "save_preset"]

log = logging.getLogger("tfxformer")

# The model arguments a fine-tuning run may set: they change no weight.
FREE_ARGUMENTS = ("dropout", "attention_dropout", "activation_dropout")


def load_run_dir(cls, path: str, checkpoint: str | None = None, precision: str = "fp32"):
    """Loads run dir `path` into `(model, record, spm_bytes)`: a `cls` (e.g.
    :class:`tfxformer.Transformer`), `record` its config.json as a
    :class:`tfxformer.rundir.RunRecord` (an older version's upgraded).

    Builds the model of `record.model` and restores the weights of `checkpoint` (default:
    :func:`tfxformer.rundir.find_checkpoint`, averaged first), checking that every model
    weight is tracked and restored; optimizer and step entries are ignored. `precision`
    "bf16" or "fp16" computes in that type (float32 weights, logits, softmax and LayerNorm).

    Raises:
        FileNotFoundError: no run dir, config.json, spm.model or checkpoint.
        ValueError: a bad precision, an unreadable config, or a checkpoint that is corrupt
            or does not fit the model.
    """
    return _loaded(cls, resolve(path, ("run_dir",), "load_run_dir"), checkpoint, precision)


def load_saved_model_weights(cls, version_dir, precision="fp32"):
    """Rebuilds `(model, record, spm_bytes)` from a SavedModel version dir of this package:
    the `cls` of its `assets/config.json` (read as a :class:`tfxformer.rundir.RunRecord`)
    with the SavedModel's variables, matched by path. Re-exports a version whose run dir
    is gone (e.g. a shipped model) with today's code.

    Raises:
        ValueError: not an export of this package, or its variables do not fit the
            config's model (:func:`assign_weights`).
    """
    loader = resolve(version_dir, ("saved_model",), "load_saved_model_weights")
    return _loaded(cls, loader, None, precision)


def _loaded(cls, loader: Loader, checkpoint, precision):
    """`(model, record, spm_bytes)` of `loader`, its model a `cls` computing in
    `precision` (checked first)."""
    if precision not in PRECISION_POLICIES:
        raise ValueError(f"precision {precision!r} not in {sorted(PRECISION_POLICIES)}.")
    return loader.load_model(cls, precision, checkpoint), loader.record(), loader.spm_bytes


def load_source(cls, path, checkpoint=None, precision="fp32", tool=None):
    """`(model, record, spm_bytes)` of the one trained model at `path` (a run dir, a
    SavedModel or a preset dir; :func:`tfxformer.locate.resolve`): a `cls` (e.g.
    :class:`tfxformer.Transformer`) computing in `precision` with its weights, its
    :class:`tfxformer.rundir.RunRecord` and its vocabulary. What translation, scoring
    and export build their translator from; `checkpoint`: a run dir's (default: its
    averaged one first).

    Raises:
        FileNotFoundError, ValueError: as :func:`tfxformer.locate.resolve` (`tool` names
            the caller in its message), or a `checkpoint` for another form.
    """
    loader = resolve(path, ONE_MODEL, tool)
    return _loaded(cls, loader, checkpoint, precision)


def load_model(cls, path, vocab_size=None, **overrides):
    """The `cls` (e.g. :class:`tfxformer.Transformer`) of the trained model at `path`
    (:func:`tfxformer.locate.resolve`), with its weights; `overrides` are model settings
    (e.g. dropout) that change no weight's shape, or a Keras `dtype`. The model's
    vocabulary comes with it (:meth:`Transformer.save_to_preset`).

    Raises:
        FileNotFoundError: `path` does not exist, or a file of it is missing.
        ValueError: not a model of this package, a `vocab_size` other than the model's, or
            overrides under which a weight no longer fits (named with both shapes).
    """
    source = resolve(path, ONE_MODEL, f"{cls.__name__}.from_preset")
    if vocab_size is not None and int(vocab_size) != source.model.vocab_size:
        raise ValueError(f"vocab_size={vocab_size} given, but the model at {path!r} has a "
                         f"vocabulary of {source.model.vocab_size}.")
    model = source.load_model(cls)
    dtype = overrides.pop("dtype", None)
    config = source.model.replace(**ModelConfig.upgrade(overrides))
    if config != source.model or dtype is not None:
        target = cls(config, **({} if dtype is None else {"dtype": dtype}))
        target.build()
        assign_weights(target, {weight_key(w.path): w for w in model.weights}, source.label)
        model = target
    model.preset_vocabulary = source.spm_bytes if os.path.isfile(source.spm_path or "") \
        else None
    model.preset_record, model.preset_name = _known_record(source), source.preset
    return model


# What a preset dir's config.json keeps of the run a model came from ("record").
_PRESET_RECORD_KEYS = ("src", "tgt", "max_length")
_PRESET_TRAIN_KEYS = ("target_languages", "reverse_target")


def _known_record(source: Loader) -> dict | None:
    """What `source` records of its run that a preset dir keeps: src, tgt, max_length and
    the training settings that change how the model is read (a multilingual model's
    target languages, a right-to-left model's `reverse_target`); None where it names no
    languages."""
    if source.direction is None:
        return None
    record = source.record().to_dict()
    known = {k: record[k] for k in _PRESET_RECORD_KEYS if record.get(k) is not None}
    train = {k: v for k, v in (record.get("train") or {}).items()
             if k in _PRESET_TRAIN_KEYS and v}
    return {**known, "train": train} if train else known


def load_tokenizer(cls, path):
    """The `cls` (e.g. :class:`tfxformer.data.Tokenizer`, built from `spm.model` bytes) of
    the vocabulary the trained model at `path` (any form of
    :func:`tfxformer.locate.resolve`) was trained with."""
    return cls(resolve(path, KINDS, f"{cls.__name__}.from_preset").spm_bytes)


def _vocabulary_bytes(model, tokenizer) -> bytes | None:
    """`spm.model` bytes of `tokenizer`: anything with `spm_bytes` (a
    :class:`tfxformer.data.Tokenizer`), bytes, or the path of a file or of a directory
    holding one; None: the vocabulary the model was loaded with."""
    if tokenizer is None:
        return getattr(model, "preset_vocabulary", None)
    if hasattr(tokenizer, "spm_bytes"):
        return bytes(tokenizer.spm_bytes)
    if isinstance(tokenizer, (bytes, bytearray)):
        return bytes(tokenizer)
    path = os.fspath(tokenizer)
    path = os.path.join(path, SPM_FILENAME) if os.path.isdir(path) else path
    with open(path, "rb") as f:
        return f.read()


def _piece_count(spm_bytes: bytes) -> int:
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(spm_bytes)
    except Exception as error:  # SentencePiece raises several types for a bad proto
        raise ValueError(f"The tokenizer is not a valid SentencePiece model ({error}).") \
            from error
    return processor.GetPieceSize()


def save_preset(model, directory, tokenizer=None, src=None, tgt=None) -> str:
    """Writes `model` as a preset dir that :func:`load_model` reads back; returns it.

    `tokenizer`: a :class:`tfxformer.data.Tokenizer`, `spm.model` bytes or a path
    (default: the vocabulary the model was loaded with, if any). `src`, `tgt`: the
    languages it translates between (default: those of the model it was loaded from, if
    that names them), recorded in config.json ("record", with the training length filter
    and a multilingual model's target languages) for the tools that read the preset dir
    (`scripts/train_wmt.py --init-from` takes its direction from there).

    Raises:
        ValueError: the vocabulary's size is not the model's, `directory` holds another
            kind of model, or only one of `src` and `tgt` is known.
    """
    directory = os.fspath(directory)
    record = dict(getattr(model, "preset_record", None) or {})
    if src is not None or tgt is not None:
        if src is None or tgt is None:
            raise ValueError(f"Give both `src` and `tgt` (got src={src!r}, tgt={tgt!r}).")
        if (record.get("src"), record.get("tgt")) != (src, tgt):
            # another direction: the recorded length filter and target languages are not its
            record = {"src": src, "tgt": tgt, "train": {
                k: v for k, v in record.get("train", {}).items() if k != "target_languages"}}
    spm_bytes = _vocabulary_bytes(model, tokenizer)
    vocab_size = model.model_config.vocab_size
    if spm_bytes is not None and _piece_count(spm_bytes) != vocab_size:
        raise ValueError(f"The tokenizer has {_piece_count(spm_bytes)} pieces, the model a "
                         f"vocabulary of {vocab_size}.")
    if os.path.isfile(os.path.join(directory, "saved_model.pb")) or os.path.isdir(
            os.path.join(directory, rundir.CHECKPOINTS)):
        raise ValueError(f"{directory!r} holds a SavedModel or a run dir; save the preset "
                         "into a directory of its own.")
    os.makedirs(directory, exist_ok=True)
    if not model.built:
        model.build()
    model.save_weights(os.path.join(directory, WEIGHTS_FILENAME), overwrite=True)
    config = {"module": type(model).__module__, "class_name": type(model).__name__,
              "registered_name": REGISTERED_NAME, "config": model.model_config.to_dict(),
              "preset": getattr(model, "preset_name", None)}
    if record:
        config["record"] = record
    metadata = {"tfxformer_version": _version(), "parameter_count": model.count_params(),
                "vocabulary_sha256": spm_bytes and hashlib.sha256(spm_bytes).hexdigest(),
                "date_saved": datetime.datetime.now(datetime.UTC).isoformat()}
    if spm_bytes is not None:
        rundir.write_atomically(os.path.join(directory, SPM_FILENAME), spm_bytes)
    for name, value in ((METADATA_FILENAME, metadata), (CONFIG_FILENAME, config)):
        rundir.write_atomically(os.path.join(directory, name),
                                json.dumps(value, indent=2).encode("utf-8"))
    return directory


def _version() -> str:
    try:
        return importlib.metadata.version("tfxformer")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


# scripts/train_wmt.py --init-from: the TrainConfig hooks.

def _given(config, name: str) -> bool:
    """Whether setting `name` differs from its TrainConfig default (so was given)."""
    field = {f.name: f for f in dataclasses.fields(config)}[name]
    return getattr(config, name) != field.default


def check_fine_tune(config) -> None:
    """Raises ValueError for a model setting of `config` that conflicts with the model of
    `config.init_from` (naming both values), FileNotFoundError / ValueError for a path
    that is no trained model of this package; the direction rule is
    :func:`fine_tune_direction`'s."""
    source = _init_source(config)
    model, where = source.model, f"the model of `init_from` {config.init_from!r}"
    fine_tune_direction(config, source)
    conflicts = []
    if _given(config, "vocab_size") and config.vocab_size != model.vocab_size:
        conflicts.append(f"`vocab_size` {config.vocab_size} given, {model.vocab_size} in "
                         f"{where}")
    if config.max_positions is not None and config.max_positions != model.max_positions:
        conflicts.append(f"`max_positions` {config.max_positions} given, "
                         f"{model.max_positions} in {where}")
    if _given(config, "preset"):
        preset = get_preset(config.preset, vocab_size=model.vocab_size)
        compared = set(ModelConfig.field_names()) - set(FREE_ARGUMENTS) - {
            "vocab_size", "max_positions"}
        differ = {k: (getattr(preset, k), getattr(model, k)) for k in ModelConfig.field_names()
                  if k in compared and getattr(preset, k) != getattr(model, k)}
        if differ:
            conflicts.append(f"`preset` {config.preset!r} given ("
                             + ", ".join(f"{k}={v}" for k, (v, _) in differ.items())
                             + f"), {where} has " + ", ".join(f"{k}={m}" for k, (_, m)
                                                              in differ.items()))
    if config.max_length > model.max_positions:
        conflicts.append(f"`max_length` {config.max_length} is above the {model.max_positions}"
                         f" positions of {where}")
    if conflicts:
        raise ValueError("Settings conflict with `init_from`: " + "; ".join(conflicts)
                         + ". Leave them out: the model settings and the vocabulary are the "
                         "source's (the dropout settings may be set).")


def fine_tune_config(config):
    """`config` with the model settings of `config.init_from` filled in (vocab_size,
    max_positions, and preset where the source names one); `config` without init_from."""
    if not config.init_from:
        return config
    check_fine_tune(config)
    source = _init_source(config)
    preset = source.preset if source.preset in PRESETS else config.preset
    return dataclasses.replace(config, vocab_size=source.model.vocab_size, preset=preset,
                               max_positions=source.model.max_positions,
                               **fine_tune_direction(config, source))


def _init_source(config) -> Loader:
    """The loader of `config.init_from`: one model's run dir, SavedModel or preset dir."""
    return resolve(config.init_from, ONE_MODEL, "`init_from`")


def fine_tune_direction(config, source: Loader) -> dict:
    """{"src", "tgt", "target_languages"} of a run from `source` (`config.init_from`):
    those the source's record names, for each that `config` leaves unset (None).

    Raises:
        ValueError: a `src`, `tgt` or `target_languages` given that differs from the
            source's (naming both) without `change_direction`; a source that names no
            languages (a preset dir saved from a model built in Keras) without both `src`
            and `tgt`; `change_direction` without both.
    """
    given = {"src": config.src, "tgt": config.tgt, "target_languages": config.target_languages}
    if source.direction is None or config.change_direction:
        missing = [f"`{k}`" for k in ("src", "tgt") if given[k] is None]
        if missing:
            why = ("`change_direction` trains another direction than the source's" if
                   source.direction is not None else f"`init_from` {config.init_from!r} is "
                   f"{source.what} that records no languages (save it with "
                   "`model.save_to_preset(dir, src=..., tgt=...)` to record them)")
            raise ValueError(f"Give {' and '.join(missing)}: {why}.")
        return {}
    recorded = {"src": source.direction[0], "tgt": source.direction[1],
                "target_languages": ",".join(source.target_languages) or None}
    same = {"src": str.__eq__, "tgt": str.__eq__, "target_languages": lambda a, b: (
        multilingual_parse(a) == multilingual_parse(b))}
    differ = [f"`{k}` {given[k]!r} given (the source's: {recorded[k]!r})" for k in recorded
              if given[k] is not None and not same[k](given[k], recorded[k])]
    if differ:
        raise ValueError(f"{'; '.join(differ)}. The source, `init_from` {config.init_from!r}, "
                         f"is {source.what}: leave them out to train its direction, or set "
                         "`change_direction` to train another on purpose.")
    return {k: v for k, v in recorded.items() if given[k] is None}


def fine_tune_model_config(config) -> ModelConfig:
    """The model of a run from `config.init_from`: the source's, with the dropout settings
    given (`dropout`, `attention_dropout`, `activation_dropout`)."""
    return _init_source(config).model.replace(**config.dropouts())


def fine_tune_vocabulary(config) -> bytes:
    """The `spm.model` bytes of `config.init_from`."""
    return _init_source(config).spm_bytes


def load_initial_weights(model, config) -> None:
    """Assigns the weights of `config.init_from` to the built training `model` (read into
    a model of the same class)."""
    source = _init_source(config)
    assign_weights(model, {weight_key(w.path): w for w in source.load_model(type(model)).weights},
                   source.label)


def init_record(config, spm_bytes: bytes) -> dict:
    """The config.json `init_from` entry of a run from `config.init_from` (path, kind,
    the weights read and the vocabulary's SHA-256).

    Raises:
        ValueError: `spm_bytes`, the run's vocabulary, is not the source's.
    """
    source = _init_source(config)
    digest = hashlib.sha256(source.spm_bytes).hexdigest()
    if hashlib.sha256(spm_bytes).hexdigest() != digest:
        raise ValueError(f"The run dir's {SPM_FILENAME} is not the vocabulary of `init_from` "
                         f"{config.init_from!r}; fine-tune into a new run dir (`model_dir`).")
    return {"path": os.fspath(config.init_from), "kind": source.kind,
            "weights": source.weights_file(), "vocabulary_sha256": digest}
