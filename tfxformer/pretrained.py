"""From a trained model to your own data: load, save and fine-tune trained Transformers.

A trained model of this package is any of:

* a SavedModel export (``saved_models/<name>``, its highest version is taken) or one of its
  version dirs (``saved_models/<name>/<N>``), as ``scripts/export.py`` and training's
  ``--export-dir`` write them;
* a run dir of ``scripts/train_wmt.py``: its averaged checkpoint first, else its latest
  (the choice ``scripts/translate.py`` makes, :func:`tfxformer.rundir.find_checkpoint`);
* a preset dir written by :meth:`tfxformer.Transformer.save_to_preset` (the keras-hub
  layout: ``config.json``, ``model.weights.h5``, ``spm.model``, ``metadata.json``).

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
import json
import os

import tensorflow as tf

from tfxformer import rundir
from tfxformer.config import PRECISION_POLICIES, PRESETS, ModelConfig, get_preset
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME, RunRecord

__all__ = ["load_model", "load_saved_model_weights", "load_tokenizer", "save_preset"]

WEIGHTS_FILENAME = "model.weights.h5"
METADATA_FILENAME = "metadata.json"
REGISTERED_NAME = "tfxformer>Transformer"
KINDS = ("preset", "saved_model", "run_dir")
_ACCEPTED = ("a SavedModel export dir of tfxformer (integer version subdirs) or one of its "
             "version dirs (saved_model.pb, assets/config.json, assets/spm.model), a run dir "
             f"of scripts/train_wmt.py ({CONFIG_FILENAME}, {SPM_FILENAME}, checkpoints/), or "
             f"a preset dir of Transformer.save_to_preset ({CONFIG_FILENAME}, "
             f"{WEIGHTS_FILENAME}, {SPM_FILENAME})")
# The model arguments a fine-tuning run may set: they change no weight.
FREE_ARGUMENTS = ("dropout", "attention_dropout", "activation_dropout")


@dataclasses.dataclass(frozen=True)
class Source:
    """A trained model on disk, read as far as its config: `kind` (one of KINDS), `path`
    (the directory holding it: a SavedModel's version dir), `model` (its
    :class:`tfxformer.config.ModelConfig`), `preset` (the preset its run started from, or
    None) and `spm_path`."""

    kind: str
    path: str
    model: ModelConfig
    preset: str | None
    spm_path: str | None

    @property
    def spm_bytes(self) -> bytes:
        if self.spm_path is None or not os.path.isfile(self.spm_path):
            raise FileNotFoundError(
                f"{self.path!r} has no vocabulary ({SPM_FILENAME}); save the preset with "
                "`model.save_to_preset(dir, tokenizer=...)`.")
        with open(self.spm_path, "rb") as f:
            return f.read()


def _listing(path: str) -> str:
    names = sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "")
                   for n in os.listdir(path))
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return shown or "nothing (it is empty)"


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read {path} ({error}); expected {what}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}; expected {what}.")
    return value


def _model_of(config: dict, path: str, key: str) -> ModelConfig:
    model = config.get(key)
    if not isinstance(model, dict) or "vocab_size" not in model:
        raise ValueError(f"{path} is not a config of this package: no {key!r} with the "
                         f"Transformer's settings (keys: {sorted(config)}).")
    return ModelConfig.from_dict(model)


def is_model_path(name) -> bool:
    """Whether `name` (given to `from_preset`) means a directory rather than a preset: a
    path object, or a string that is no preset name and holds a "/" or exists."""
    if isinstance(name, os.PathLike):
        return True
    return isinstance(name, str) and name not in PRESETS and (
        os.sep in name or "/" in name or os.path.exists(name))


def resolve(path) -> Source:
    """Says what the trained model at `path` is, reading its config only.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: `path` is not a model of this package (the message lists its files).
    """
    from tfxformer.serving.loading import resolve_model_dir

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path!r} does not exist; expected {_ACCEPTED}.")
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is a file, not a model directory; expected {_ACCEPTED}.")
    config_path = os.path.join(path, CONFIG_FILENAME)
    if os.path.isfile(os.path.join(path, WEIGHTS_FILENAME)) and os.path.isfile(config_path):
        config = _read_json(config_path, "the config.json of Transformer.save_to_preset")
        if config.get("registered_name") != REGISTERED_NAME:
            raise ValueError(f"{config_path} describes {config.get('registered_name')!r}, "
                             f"not {REGISTERED_NAME!r}: not a preset of this package.")
        return Source("preset", path, _model_of(config, config_path, "config"),
                      config.get("preset"), os.path.join(path, SPM_FILENAME))
    try:
        kind, resolved = resolve_model_dir(path)
    except FileNotFoundError:
        raise ValueError(f"{path!r} is not a model of this package: it holds "
                         f"{_listing(path)}; expected {_ACCEPTED}.") from None
    if kind == "run_dir":
        record = rundir.read_config(resolved)
        return Source(kind, resolved, _model_of(record, resolved, "model"),
                      record.get("preset"), os.path.join(resolved, SPM_FILENAME))
    assets = os.path.join(resolved, "assets")
    wanted = [os.path.join(assets, name) for name in (CONFIG_FILENAME, SPM_FILENAME)]
    if not all(os.path.isfile(p) for p in wanted):
        found = _listing(assets) if os.path.isdir(assets) else "no assets/ at all"
        raise ValueError(f"SavedModel {resolved!r} is not an export of this package: its "
                         f"assets/ holds {found}, not {CONFIG_FILENAME} and {SPM_FILENAME}.")
    config = _read_json(wanted[0], "the config.json asset of a tfxformer export")
    _check_single(config, resolved)
    return Source(kind, resolved, _model_of(config, wanted[0], "model"), config.get("preset"),
                  wanted[1])


def _check_single(config: dict, path: str) -> None:
    """Raises ValueError for the config.json asset of an ensemble export: it holds several
    models (:func:`tfxformer.serving.export.export_ensemble`), none of which loads alone."""
    members = config.get("ensemble")
    if not members:
        return
    sources = ", ".join(str(m.get("source")) for m in members if isinstance(m, dict))
    raise ValueError(f"SavedModel {path!r}: an ensemble export holds {len(members)} models; "
                     f"load a member's own export or run dir (its members: {sources}).")


def weight_key(path: str) -> str:
    """A weight's path below the model's own (auto-numbered) name, without a ":0"."""
    return path.rsplit(":", 1)[0].split("/", 1)[-1]


def assign_weights(model, values: dict, source: str) -> None:
    """Assigns `values` ({:func:`weight_key`: array}) to the built `model`'s weights.

    Raises:
        ValueError: a weight is missing from `values`, left over, or of another shape; the
            message names the weights and both shapes.
    """
    weights = {weight_key(w.path): w for w in model.weights}
    missing = sorted(set(weights) - set(values))
    unused = sorted(set(values) - set(weights))
    if missing or unused:
        raise ValueError(f"The weights of {source} do not fit this model: {len(missing)} of "
                         f"its {len(weights)} weights are not there (e.g. {missing[:3]}), "
                         f"{len(unused)} there are not the model's (e.g. {unused[:3]}).")
    wrong = [f"{key}: {tuple(values[key].shape)} in {source}, {tuple(w.shape)} in the model"
             for key, w in weights.items() if tuple(values[key].shape) != tuple(w.shape)]
    if wrong:
        raise ValueError(f"{len(wrong)} weight(s) of {source} do not fit this model: "
                         + "; ".join(wrong[:4]) + (" ..." if len(wrong) > 4 else "") + ".")
    for key, weight in weights.items():
        weight.assign(tf.cast(values[key], weight.dtype))


def load_saved_model_weights(version_dir, precision="fp32"):
    """Rebuilds `(model, record, spm_bytes)` from a SavedModel version dir of this package:
    the Transformer of its `assets/config.json` (read as a :class:`tfxformer.rundir.RunRecord`)
    with the SavedModel's variables, matched by path. Re-exports a version whose run dir
    is gone (e.g. a shipped model) with today's code.

    Raises:
        ValueError: not an export of this package, or its variables do not fit the
            config's model (:func:`assign_weights`).
    """
    source = resolve(version_dir)
    with open(os.path.join(source.path, "assets", CONFIG_FILENAME), encoding="utf-8") as f:
        record = RunRecord.from_dict(json.load(f))
    from tfxformer.data.tokenizer import load_sentencepiece_ops

    load_sentencepiece_ops()  # the translator's graph holds the SentencePiece ops
    saved = tf.saved_model.load(source.path)
    if not hasattr(saved, "model_variables"):
        raise ValueError(f"SavedModel {source.path!r} has no `model_variables`: not a "
                         "translator exported by this package.")
    model = _built(source.model, PRECISION_POLICIES[precision])
    assign_weights(model, {weight_key(v.name): v for v in saved.model_variables},
                   f"SavedModel {source.path!r}")
    return model, record, source.spm_bytes


def _built(config: ModelConfig, dtype=None):
    from tfxformer.models.transformer import Transformer

    model = Transformer(config, **({} if dtype is None else {"dtype": dtype}))
    model.build()
    return model


def _weights_file(source: Source) -> str:
    """What the weights of `source` are read from: a SavedModel version dir, the run dir's
    checkpoint (:func:`tfxformer.rundir.find_checkpoint`, averaged first) or a weights file."""
    if source.kind == "saved_model":
        return source.path
    if source.kind == "run_dir":
        return rundir.find_checkpoint(source.path)
    return os.path.join(source.path, WEIGHTS_FILENAME)


def _load(source: Source):
    """The source's model at float32, with its weights."""
    if source.kind == "saved_model":
        return load_saved_model_weights(source.path)[0]
    if source.kind == "run_dir":
        return rundir.load_model(source.path, _weights_file(source))[0]
    model = _built(source.model)
    try:
        model.load_weights(_weights_file(source))
    except (ValueError, OSError) as error:
        raise ValueError(f"{_weights_file(source)} does not fit the model of its "
                         f"{CONFIG_FILENAME}: {str(error)[:400]}") from None
    return model


def load_model(path, vocab_size=None, **overrides):
    """The Keras Transformer of the trained model at `path` (:func:`resolve`), with its
    weights; `overrides` are model settings (e.g. dropout) that change no weight's shape,
    or a Keras `dtype`. The model's vocabulary comes with it (:meth:`Transformer.save_to_preset`).

    Raises:
        FileNotFoundError: `path` does not exist, or a file of it is missing.
        ValueError: not a model of this package, a `vocab_size` other than the model's, or
            overrides under which a weight no longer fits (named with both shapes).
    """
    source = resolve(path)
    if vocab_size is not None and int(vocab_size) != source.model.vocab_size:
        raise ValueError(f"vocab_size={vocab_size} given, but the model at {path!r} has a "
                         f"vocabulary of {source.model.vocab_size}.")
    model = _load(source)
    dtype = overrides.pop("dtype", None)
    config = source.model.replace(**ModelConfig.upgrade(overrides))
    if config != source.model or dtype is not None:
        target = _built(config, dtype)
        assign_weights(target, {weight_key(w.path): w for w in model.weights},
                       f"{source.kind.replace('_', ' ')} {source.path!r}")
        model = target
    model.preset_vocabulary = source.spm_bytes if os.path.isfile(source.spm_path or "") \
        else None
    return model


def load_tokenizer(path):
    """The :class:`tfxformer.data.Tokenizer` the trained model at `path` was trained with."""
    from tfxformer.data.tokenizer import Tokenizer

    return Tokenizer(resolve(path).spm_bytes)


def _vocabulary_bytes(model, tokenizer) -> bytes | None:
    from tfxformer.data.tokenizer import Tokenizer

    if tokenizer is None:
        return getattr(model, "preset_vocabulary", None)
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.spm_bytes
    if isinstance(tokenizer, (bytes, bytearray)):
        return Tokenizer(bytes(tokenizer)).spm_bytes
    return Tokenizer.load(os.fspath(tokenizer)).spm_bytes


def save_preset(model, directory, tokenizer=None) -> str:
    """Writes `model` as a preset dir that :func:`load_model` reads back; returns it.

    `tokenizer`: a :class:`tfxformer.data.Tokenizer`, `spm.model` bytes or a path
    (default: the vocabulary the model was loaded with, if any).

    Raises:
        ValueError: the vocabulary's size is not the model's, or `directory` holds another
            kind of model.
    """
    directory = os.fspath(directory)
    spm_bytes = _vocabulary_bytes(model, tokenizer)
    vocab_size = model.model_config.vocab_size
    if spm_bytes is not None:
        from tfxformer.data.tokenizer import Tokenizer

        if Tokenizer(spm_bytes).vocab_size != vocab_size:
            raise ValueError(f"The tokenizer has {Tokenizer(spm_bytes).vocab_size} pieces, "
                             f"the model a vocabulary of {vocab_size}.")
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
              "preset": None}
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
    import tfxformer

    return tfxformer.__version__


# scripts/train_wmt.py --init-from: the TrainConfig hooks.

def _given(config, name: str) -> bool:
    """Whether setting `name` differs from its TrainConfig default (so was given)."""
    field = {f.name: f for f in dataclasses.fields(config)}[name]
    return getattr(config, name) != field.default


def check_fine_tune(config) -> None:
    """Raises ValueError for a model setting of `config` that conflicts with the model of
    `config.init_from` (naming both values), FileNotFoundError / ValueError for a path
    that is no trained model of this package."""
    source = resolve(config.init_from)
    model, where = source.model, f"the model of `init_from` {config.init_from!r}"
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
    source = resolve(config.init_from)
    preset = source.preset if source.preset in PRESETS else config.preset
    return dataclasses.replace(config, vocab_size=source.model.vocab_size, preset=preset,
                               max_positions=source.model.max_positions)


def fine_tune_model_config(config) -> ModelConfig:
    """The model of a run from `config.init_from`: the source's, with the dropout settings
    given (`dropout`, `attention_dropout`, `activation_dropout`)."""
    return resolve(config.init_from).model.replace(**config.dropouts())


def fine_tune_vocabulary(config) -> bytes:
    """The `spm.model` bytes of `config.init_from`."""
    return resolve(config.init_from).spm_bytes


def load_initial_weights(model, config) -> None:
    """Assigns the weights of `config.init_from` to the built training `model`."""
    source = resolve(config.init_from)
    assign_weights(model, {weight_key(w.path): w for w in _load(source).weights},
                   f"{source.kind.replace('_', ' ')} {source.path!r}")


def init_record(config, spm_bytes: bytes) -> dict:
    """The config.json `init_from` entry of a run from `config.init_from` (path, kind,
    the weights read and the vocabulary's SHA-256).

    Raises:
        ValueError: `spm_bytes`, the run's vocabulary, is not the source's.
    """
    source = resolve(config.init_from)
    digest = hashlib.sha256(source.spm_bytes).hexdigest()
    if hashlib.sha256(spm_bytes).hexdigest() != digest:
        raise ValueError(f"The run dir's {SPM_FILENAME} is not the vocabulary of `init_from` "
                         f"{config.init_from!r}; fine-tune into a new run dir (`model_dir`).")
    return {"path": os.fspath(config.init_from), "kind": source.kind,
            "weights": _weights_file(source), "vocabulary_sha256": digest}
