"""What is at this path: the one answer, for every tool that takes a trained model.

A trained model of this package is on disk in one of these forms (:data:`KINDS`):

* ``run_dir``: a run dir of ``scripts/train_wmt.py`` (``config.json``, ``spm.model``,
  ``checkpoints/``; its averaged checkpoint ``averaged/`` first; :mod:`tfxformer.rundir`);
* ``saved_model``: a SavedModel export dir (``saved_models/<name>``: integer version
  subdirs, the highest is taken) or one of its version dirs (``saved_model.pb``,
  ``assets/config.json``, ``assets/spm.model``), as ``scripts/export.py`` and training's
  ``--export-dir`` write;
* ``preset``: a preset dir of ``Transformer.save_to_preset`` (the keras-hub layout:
  ``config.json``, ``model.weights.h5``, ``spm.model``, ``metadata.json``);
* ``ensemble``: a SavedModel export of several models (``scripts/export.py --ensemble``);
* ``ctranslate2``: a CTranslate2 directory (``scripts/export.py --format ctranslate2``:
  ``model.bin``, ``config.json``, ``spm.model``, ``tfxformer.json``).

A run dir, SavedModel or preset dir of a multilingual model (several target languages) is
that kind, with :attr:`Loader.target_languages`. :func:`resolve` gives the loader of the
form a path holds (one :class:`Loader` subclass per form, as keras-hub's
`get_preset_loader`); given the forms a tool takes, it raises a one-line error naming
the path, what is there and those forms. A loader reads its records, loads its weights
into a class it is handed (:meth:`Loader.load_model`) and hands what it holds to the
caller's runtime (:meth:`Loader.open`): the model and tokenizer classes, the
translators and everything that builds them (:mod:`tfxformer.pretrained`, serving) sit
above this module, which imports none of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import ClassVar

import tensorflow as tf

from tfxformer import precision as machine_precision
from tfxformer import rundir, weights
from tfxformer.config import PRESETS, ModelConfig
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME, RunRecord
from tfxformer.sentencepiece_ops import load_sentencepiece_ops

__all__ = ["FORMS", "KINDS", "CTranslate2Loader", "EnsembleLoader", "Loader", "PresetLoader",
           "RunDirLoader", "SavedModelLoader", "describe_forms", "is_ctranslate2_dir",
           "is_model_path", "read_ctranslate2_marker", "resolve",
           "resolve_model_dir", "saved_model_versions", "source_name", "target_languages_of"]

WEIGHTS_FILENAME = "model.weights.h5"
METADATA_FILENAME = "metadata.json"
REGISTERED_NAME = "tfxformer>Transformer"
# A CTranslate2 directory of this package (tfxformer.serving.ctranslate2): CTranslate2's
# own two files and our record.
CT2_FILES = ("model.bin", "config.json")
CT2_MARKER_FILENAME = "tfxformer.json"
CT2_FORMAT = "tfxformer-ctranslate2"
CT2_FORMAT_VERSION = 1

# The forms, in the order messages list them.
FORMS = {
    "saved_model": "a SavedModel export dir of one model (integer version subdirs, the "
                   "highest taken) or one of its version dirs (saved_model.pb, "
                   "assets/config.json, assets/spm.model)",
    "run_dir": f"a run dir of scripts/train_wmt.py ({CONFIG_FILENAME}, {SPM_FILENAME}, "
               "checkpoints/; averaged/ first)",
    "preset": f"a preset dir of Transformer.save_to_preset ({CONFIG_FILENAME}, "
              f"{WEIGHTS_FILENAME}, {SPM_FILENAME})",
    "ensemble": "an ensemble export (scripts/export.py --ensemble)",
    "ctranslate2": "a CTranslate2 dir (scripts/export.py --format ctranslate2)",
}
KINDS = tuple(FORMS)
# The forms that hold the weights of one Keras model (what builds a Transformer).
ONE_MODEL = ("saved_model", "run_dir", "preset")


def describe_forms(kinds=KINDS, multilingual=True) -> str:
    """The forms `kinds` as one phrase for a message ("a SavedModel ..., or a run dir ...")."""
    names = [FORMS[kind] for kind in KINDS if kind in kinds]
    phrase = names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", or " + names[-1]
    return phrase + ("" if multilingual else ", of one target language (not multilingual)")


def saved_model_versions(export_dir):
    """Sorted integer versions `v` with `<export_dir>/<v>/saved_model.pb`."""
    if not os.path.isdir(export_dir):
        return []
    return sorted(int(name) for name in os.listdir(export_dir) if name.isdigit()
                  and os.path.isfile(os.path.join(export_dir, name, "saved_model.pb")))


def is_ctranslate2_dir(path) -> bool:
    """Whether `path` is a CTranslate2 model directory written by this package
    (:func:`tfxformer.serving.ctranslate2_export.export_ctranslate2`: model.bin,
    config.json and tfxformer.json)."""
    path = os.fspath(path)
    return all(os.path.isfile(os.path.join(path, name))
               for name in (*CT2_FILES, CT2_MARKER_FILENAME))


def read_ctranslate2_marker(path) -> dict:
    """The tfxformer.json record of the CTranslate2 directory `path`.

    Raises:
        FileNotFoundError: `path` is no CTranslate2 directory.
        ValueError: a CTranslate2 model not exported by this package, or an unreadable
            or unknown record.
    """
    path = os.fspath(path)
    if not all(os.path.isfile(os.path.join(path, name)) for name in CT2_FILES):
        raise FileNotFoundError(f"{path!r} is not a CTranslate2 model directory (no "
                                f"{' and '.join(CT2_FILES)}).")
    marker = os.path.join(path, CT2_MARKER_FILENAME)
    if not os.path.isfile(marker):
        raise ValueError(f"{path!r} is a CTranslate2 model, but not one exported by tfxformer "
                         f"(no {CT2_MARKER_FILENAME}: its vocabulary and decoding limits are "
                         "unknown); export it with `scripts/export.py --format ctranslate2`.")
    record = read_json(marker, f"a record of {CT2_FORMAT!r}")
    if record.get("format") != CT2_FORMAT:
        raise ValueError(f"{marker} is not a record of {CT2_FORMAT!r}.")
    if record.get("format_version", 0) > CT2_FORMAT_VERSION:
        raise ValueError(f"{marker} is format version {record['format_version']}; this "
                         f"tfxformer reads up to {CT2_FORMAT_VERSION}: upgrade tfxformer.")
    return record


def resolve_model_dir(path):
    """(kind, path) of :func:`resolve`: one of :data:`KINDS` and the directory holding the
    model (a SavedModel's version dir)."""
    source = resolve(path)
    return source.kind, source.path


def source_name(path) -> str:
    """A model's name for a record: its path's last component ("en_de/3" for a
    SavedModel version dir), so that no machine path goes into the record."""
    parts = os.path.normpath(os.path.abspath(os.fspath(path))).split(os.sep)
    return "/".join(parts[-2:]) if parts[-1].isdigit() else parts[-1]


def target_languages_of(path) -> tuple[str, ...]:
    """The target languages of the multilingual model at `path` (any form,
    :func:`resolve`), or () for a model of one target. Raises as :func:`resolve`."""
    return resolve(path).target_languages


@dataclasses.dataclass(frozen=True)
class Loader:
    """A trained model on disk, read as far as its records, and how to load it: one
    subclass per form (keras-hub's preset loaders), so that callers ask it to load and
    never branch on the form themselves.

    Attributes:
        kind: one of :data:`KINDS` (a class attribute).
        path: the directory holding it (a SavedModel's version dir).
        model: its :class:`tfxformer.config.ModelConfig` (an ensemble's: its first
            member's; None for a CTranslate2 dir that records none).
        preset: the preset its run started from, or None.
        spm_path: its vocabulary's file (`spm.model`), or None.
        run_record: its :class:`RunRecord` (a preset dir's: the model and what it
            records of its run; a CTranslate2 dir's: from tfxformer.json).
        direction_known: whether the record names the languages (src and tgt): a preset
            saved from a model built in Keras does not.
        given: the path as the caller gave it (messages name it), or None: `path`.

    What a form loads: :meth:`load_model` (the weights of one model into a handed
    class), :meth:`weights_file`, and :meth:`open`, which hands what the form holds (a
    Keras model, a loaded SavedModel, a CTranslate2 dir) to the caller's runtime.
    """

    kind: ClassVar[str] = ""
    noun: ClassVar[str] = ""  # what it is, for messages
    # What the form cannot do that a tool may ask for: feature -> why, for messages.
    lacks: ClassVar[dict] = {}

    path: str
    model: ModelConfig | None
    preset: str | None
    spm_path: str | None
    run_record: RunRecord | None = None
    direction_known: bool = True
    given: str | None = dataclasses.field(default=None, compare=False)

    @property
    def spm_bytes(self) -> bytes:
        if self.spm_path is None or not os.path.isfile(self.spm_path):
            raise FileNotFoundError(
                f"{self.path!r} has no vocabulary ({SPM_FILENAME}); save the preset with "
                "`model.save_to_preset(dir, tokenizer=...)`.")
        with open(self.spm_path, "rb") as f:
            return f.read()

    def record(self) -> RunRecord | None:
        """Its :class:`RunRecord`: a run dir's config.json, a SavedModel's config asset, a
        preset dir's model and what it records of its run."""
        return self.run_record

    @property
    def target_languages(self) -> tuple[str, ...]:
        """A multilingual model's target languages, or () for one of one target."""
        return () if self.run_record is None else self.run_record.target_languages

    @property
    def direction(self) -> tuple[str, str] | None:
        """(src, tgt) as the record names them, or None where it does not."""
        if not self.direction_known or self.run_record is None:
            return None
        return self.run_record.src, self.run_record.tgt

    @property
    def what(self) -> str:
        """What it is, for messages: "a multilingual SavedModel (de, fr)", "a run dir"..."""
        what = self.noun
        if self.target_languages:
            what = (f"a multilingual {what.split(' ', 1)[1]} "
                    f"({', '.join(self.target_languages)})")
        return what

    @property
    def label(self) -> str:
        """The source for messages: its kind and path."""
        return f"{self.kind.replace('_', ' ')} {self.path!r}"

    @property
    def shown(self) -> str:
        """The path as the caller gave it."""
        return self.path if self.given is None else self.given

    def require(self, kinds, tool: str | None = None, given=None,
                multilingual=True) -> Loader:
        """This loader if it is one of `kinds` (and not multilingual unless `multilingual`),
        else ValueError in one line naming the path (`given`, else its own), what it is
        and the forms `tool` takes."""
        if self.kind in kinds and (multilingual or not self.target_languages):
            return self
        shown = self.path if given is None else os.fspath(given)
        raise ValueError(f"{f'{tool}: ' if tool else ''}{shown!r} is {self.what}; expected "
                         f"{describe_forms(kinds, multilingual)}.")

    def check_checkpoint(self, checkpoint, name="`checkpoint`") -> None:
        """ValueError for a `checkpoint` given to a form that has none (not a run dir)."""
        if checkpoint is not None:
            raise ValueError(f"{name} applies to a run dir; {self.shown!r} is {self.what}.")

    def load_settings(self, precision) -> dict:
        """What decides the model this form loads, besides its path, for a record: a
        run dir's or preset dir's compute type `precision` and a run dir's checkpoint
        (relative to it); {} for a form that computes as it was exported."""
        return {}

    def weights_file(self) -> str:
        """What the weights are read from (a SavedModel version dir, a run dir's
        checkpoint, a weights file). Raises ValueError for a form not of one model."""
        raise self._not_one_model()

    def load_model(self, cls, precision=None, checkpoint=None):
        """The model, a built `cls` (e.g. :class:`tfxformer.Transformer`) with its
        weights, computing in `precision` (None: a preset dir's the Keras global policy,
        the others' "fp32"); `checkpoint`: a run dir's (default: its averaged one first).

        Raises:
            ValueError: a form not of one Keras model, a `checkpoint` for a form other
                than a run dir, a bad precision, weights that do not fit.
        """
        raise self._not_one_model()

    def open(self, runtime, precision="fp32", checkpoint=None, **options):
        """What `runtime` builds of this model, handed what this form holds:
        `runtime.from_model(loader, model, **options)` for one Keras model (of class
        `runtime.model_class`, computing in `precision`: "fp32", "bf16", "fp16" or
        AUTO, :func:`tfxformer.precision.resolve`), `runtime.from_saved_model(loader,
        loaded, **options)` for a SavedModel, `runtime.from_ctranslate2(loader,
        **options)` for a CTranslate2 dir. An option of another form (not None) is a
        ValueError naming it and this form."""
        raise NotImplementedError

    def _not_one_model(self) -> ValueError:
        return ValueError(f"{self.shown!r} is {self.what}, not the weights of one model; "
                          f"expected {describe_forms(ONE_MODEL)}.")

    def _no_ctranslate2_options(self, options) -> dict:
        """`options` without CTranslate2's own; ValueError for one that is given."""
        for name in CT2_OPTIONS:
            value = options.pop(name, None)
            if value is not None:
                raise ValueError(f"`{name}` {value!r} applies to CTranslate2 models; "
                                 f"{self.shown!r} is not one (a CTranslate2 directory holds "
                                 f"{CT2_FILES[0]}).")
        return options


# The options only a CTranslate2 dir takes.
CT2_OPTIONS = ("compute_type", "threads")
# The options a CTranslate2 dir takes: its own and the decoding options it has.
CT2_DECODING = ("beam_size", "alpha", "extra_length", "batch_size", "num_hypotheses",
                "no_repeat_ngram_size", "repetition_penalty")


class _KerasLoader(Loader):
    """A form whose weights load into one Keras model (run dir, preset dir)."""

    def load_settings(self, precision) -> dict:
        return {"precision": precision}

    def open(self, runtime, precision="fp32", checkpoint=None, **options):
        options = self._no_ctranslate2_options(options)
        precision, _ = machine_precision.resolve(precision)
        model = self.load_model(runtime.model_class, precision, checkpoint)
        return runtime.from_model(self, model, **options)


class RunDirLoader(_KerasLoader):
    """A run dir of scripts/train_wmt.py: its averaged checkpoint first, else its latest
    (:func:`tfxformer.rundir.find_checkpoint`)."""

    kind, noun = "run_dir", "a run dir"

    @property
    def what(self) -> str:
        averaged = os.path.isdir(os.path.join(self.path, rundir.AVERAGED))
        return super().what.replace("a run dir", "an averaged run dir") if averaged \
            else super().what

    @property
    def spm_bytes(self) -> bytes:
        return rundir.read_spm_bytes(self.path)

    def weights_file(self) -> str:
        return rundir.find_checkpoint(self.path)

    def load_settings(self, precision) -> dict:
        checkpoint = self.weights_file()
        return dict(super().load_settings(precision),
                    checkpoint=checkpoint and os.path.relpath(checkpoint, self.path))

    def load_model(self, cls, precision=None, checkpoint=None):
        checkpoint = checkpoint or self.weights_file()
        if checkpoint is None:
            raise FileNotFoundError(
                f"No checkpoint in run dir {self.path!r}: looked for the latest ckpt-<step> "
                "that the state file `checkpoint` names in "
                f"{', '.join(f'{d}/' for d in (rundir.AVERAGED, rundir.CHECKPOINTS))}.")
        model = weights.build(cls, self.model, precision or "fp32")
        weights.restore_checkpoint(model, checkpoint)
        return model


class PresetLoader(_KerasLoader):
    """A preset dir of `Transformer.save_to_preset` (keras-hub's layout)."""

    kind, noun = "preset", "a preset dir of Transformer.save_to_preset"

    def weights_file(self) -> str:
        return os.path.join(self.path, WEIGHTS_FILENAME)

    def load_model(self, cls, precision=None, checkpoint=None):
        self.check_checkpoint(checkpoint)
        model = weights.build(cls, self.model, precision=precision)
        weights.load_weights_file(model, self.weights_file())
        return model


class SavedModelLoader(Loader):
    """A SavedModel version dir of this package (an export dir's highest version)."""

    kind, noun = "saved_model", "a SavedModel"

    def weights_file(self) -> str:
        return self.path

    def load_model(self, cls, precision=None, checkpoint=None):
        self.check_checkpoint(checkpoint)
        model = weights.build(cls, self.model, precision or "fp32")
        weights.assign_weights(model, weights.saved_model_variables(self.path),
                               f"SavedModel {self.path!r}")
        return model

    def open(self, runtime, precision="fp32", checkpoint=None, **options):
        options = self._no_ctranslate2_options(options)
        for name, value, default in (("precision", precision, "fp32"),
                                     ("checkpoint", checkpoint, None)):
            if value != default and not (name == "precision"
                                         and value == machine_precision.AUTO):
                raise ValueError(f"`{name}` {value!r} applies to run dirs; {self.path!r} is "
                                 f"{self.what}, which computes as it was exported.")
        return runtime.from_saved_model(self, self.load_saved_model(), **options)

    def load_saved_model(self):
        """The SavedModel, loaded (with the SentencePiece ops it needs).

        Raises:
            ValueError: TensorFlow cannot load it.
        """
        load_sentencepiece_ops()
        try:
            return tf.saved_model.load(self.path)
        except (tf.errors.OpError, OSError, ValueError) as err:
            raise ValueError(f"Could not load the SavedModel {self.path!r}: {err}") from None


class EnsembleLoader(SavedModelLoader):
    """A SavedModel export of several models (scripts/export.py --ensemble): it loads
    as a SavedModel, not as one model's weights."""

    kind, noun = "ensemble", "an ensemble export"

    @property
    def what(self) -> str:
        members = [m for m in self.run_record.export.get("ensemble") or ()
                   if isinstance(m, dict)]
        what = (f"{self.noun} of {len(members)} models ("
                + ", ".join(str(m.get("source")) for m in members) + ")")
        if self.target_languages:
            what = (f"a multilingual {what.split(' ', 1)[1]} "
                    f"({', '.join(self.target_languages)})")
        return what

    def weights_file(self) -> str:
        raise self._not_one_model()

    def load_model(self, cls, precision=None, checkpoint=None):
        raise self._not_one_model()


class CTranslate2Loader(Loader):
    """A CTranslate2 dir of this package (model.bin, config.json, spm.model,
    tfxformer.json)."""

    kind, noun = "ctranslate2", "a CTranslate2 dir"
    lacks: ClassVar[dict] = {
        "constraints": "and CTranslate2 has no terminology constraints",
        "token_scores": "whose translate_batch gives each hypothesis' score but not each "
                        "token's log-probability (only the whole vocabulary's logits)"}

    def open(self, runtime, precision="fp32", checkpoint=None, **options):
        given = {k: v for k, v in dict(options, precision=precision,
                                       checkpoint=checkpoint).items()
                 if k not in CT2_OPTIONS + CT2_DECODING and v is not None
                 and not (k == "precision" and v in ("fp32", machine_precision.AUTO))}
        if given:
            raise ValueError(f"{sorted(given)} apply to SavedModels and run dirs; "
                             f"{self.shown!r} is a CTranslate2 model (its options: "
                             f"{', '.join(CT2_OPTIONS)}).")
        return runtime.from_ctranslate2(self, **{k: v for k, v in options.items()
                                                 if k in CT2_OPTIONS + CT2_DECODING})


def _listing(path: str) -> str:
    names = sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "")
                   for n in os.listdir(path))
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return shown or "nothing (it is empty)"


def read_json(path: str, what: str) -> dict:
    """The JSON object in `path`; ValueError naming `what` was expected otherwise."""
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


def _names_direction(record: dict) -> bool:
    """Whether a config.json record names its languages (itself, or under "train")."""
    train = record.get("train") if isinstance(record.get("train"), dict) else {}
    return bool((record.get("src") or train.get("src")) and (record.get("tgt")
                                                            or train.get("tgt")))


def is_model_path(name) -> bool:
    """Whether `name` (given to `from_preset`) means a directory rather than a preset: a
    path object, or a string that is no preset name and holds a "/" or exists."""
    if isinstance(name, os.PathLike):
        return True
    return isinstance(name, str) and name not in PRESETS and (
        os.sep in name or "/" in name or os.path.exists(name))


def resolve(path, kinds=KINDS, tool: str | None = None, multilingual=True) -> Loader:
    """The loader of the trained model at `path` (one subclass of :class:`Loader` per
    form, :data:`KINDS`), reading its records only.

    Args:
        path: any form of trained model of this package.
        kinds: the forms the caller takes; another is a ValueError naming it and them.
        tool: the caller, as messages name it (e.g. "scripts/translate.py --model").
        multilingual: whether the caller takes a multilingual model.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: `path` is no model of this package (the message lists its files), or
            a form the caller does not take. Every message is one line naming the path,
            what is there and the forms the caller takes.
    """
    path = os.fspath(path)
    prefix = f"{tool}: " if tool else ""
    expected = describe_forms(kinds, multilingual)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{prefix}{path!r} does not exist; expected {expected}.")
    if not os.path.isdir(path):
        raise ValueError(f"{prefix}{path!r} is a file, not a model directory; expected "
                         f"{expected}.")
    try:
        source = _read(path)
    except (ValueError, FileNotFoundError) as error:
        raise type(error)(f"{prefix}{error} Expected {expected}.") from None
    if source is None:
        raise ValueError(f"{prefix}{path!r} is not a model of this package: it holds "
                         f"{_listing(path)}; expected {expected}.")
    return dataclasses.replace(source, given=path).require(kinds, tool, path, multilingual)


def _read(path: str) -> Loader | None:
    """The loader of directory `path`, or None for a directory of none of the forms."""
    config_path = os.path.join(path, CONFIG_FILENAME)
    if os.path.isfile(os.path.join(path, CT2_FILES[0])):
        return _ctranslate2(path)
    if os.path.isfile(os.path.join(path, WEIGHTS_FILENAME)) and os.path.isfile(config_path):
        return _preset(path, config_path)
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return _saved_model(path)
    versions = saved_model_versions(path)
    if versions:
        return _saved_model(os.path.join(path, str(versions[-1])))
    if os.path.isfile(config_path):
        record = rundir.read_config(path)
        return RunDirLoader(path, _model_of(record, config_path, "model"),
                      record.get("preset"), os.path.join(path, SPM_FILENAME),
                      RunRecord.from_dict(record), _names_direction(record))
    return None


def _ctranslate2(path: str) -> Loader:
    marker = read_ctranslate2_marker(path)
    model = marker.get("model")
    model = ModelConfig.from_dict(model) if isinstance(model, dict) else None
    record = None if model is None else RunRecord(
        model=model, src=marker.get("src") or "en", tgt=marker.get("tgt") or "de",
        preset=marker.get("preset"), vocabulary_sha256=marker.get("vocabulary_sha256"))
    return CTranslate2Loader(path, model, marker.get("preset"),
                  os.path.join(path, SPM_FILENAME), record, _names_direction(marker))


def _preset(path: str, config_path: str) -> Loader:
    """A preset dir: its config.json names the class, the model, the preset, and (since
    save_to_preset records them) what it knows of the run: src, tgt, max_length and a
    multilingual model's target languages ("record")."""
    config = read_json(config_path, "the config.json of Transformer.save_to_preset")
    if config.get("registered_name") != REGISTERED_NAME:
        raise ValueError(f"{config_path} describes {config.get('registered_name')!r}, "
                         f"not {REGISTERED_NAME!r}: not a preset of this package.")
    model = _model_of(config, config_path, "config")
    known = config.get("record") if isinstance(config.get("record"), dict) else {}
    record = RunRecord.from_dict({**known, "model": model.to_dict(),
                                  "preset": config.get("preset")})
    return PresetLoader(path, model, config.get("preset"),
                  os.path.join(path, SPM_FILENAME), record, _names_direction(known))


def _saved_model(version_dir: str) -> Loader:
    assets = os.path.join(version_dir, "assets")
    wanted = [os.path.join(assets, name) for name in (CONFIG_FILENAME, SPM_FILENAME)]
    if not all(os.path.isfile(p) for p in wanted):
        found = _listing(assets) if os.path.isdir(assets) else "no assets/ at all"
        raise ValueError(f"SavedModel {version_dir!r} is not an export of this package: its "
                         f"assets/ holds {found}, not {CONFIG_FILENAME} and {SPM_FILENAME}.")
    config = read_json(wanted[0], "the config.json asset of a tfxformer export")
    loader = EnsembleLoader if config.get("ensemble") else SavedModelLoader
    return loader(version_dir, _model_of(config, wanted[0], "model"),
                  config.get("preset"), wanted[1], RunRecord.from_dict(config),
                  _names_direction(config))
