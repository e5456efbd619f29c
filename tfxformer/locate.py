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
form a path holds (one :class:`tfxformer.loaders.Loader` subclass per form, as
keras-hub's `get_preset_loader`); given the forms a tool takes, it raises a one-line
error naming the path, what is there and those forms. A loader reads its records, loads
its weights into a class it is handed (:meth:`Loader.load_model`) and hands what it holds
to the caller's runtime (:meth:`Loader.open`): the model and tokenizer classes, the
translators and everything that builds them (:mod:`tfxformer.pretrained`, serving) sit
above this module and :mod:`tfxformer.loaders`, which import none of them. The forms'
files and names are :mod:`tfxformer.forms`'.
"""

from __future__ import annotations

import dataclasses
import os

from tfxformer import rundir
from tfxformer.config import ModelConfig
from tfxformer.forms import (  # noqa: F401 (the forms' names, public here too)
    CT2_FILES,
    CT2_FORMAT,
    CT2_FORMAT_VERSION,
    CT2_MARKER_FILENAME,
    FORMS,
    KINDS,
    METADATA_FILENAME,
    ONE_MODEL,
    REGISTERED_NAME,
    WEIGHTS_FILENAME,
    describe_forms,
    is_ctranslate2_dir,
    is_model_path,
    read_ctranslate2_marker,
    read_json,
    saved_model_versions,
    source_name,
)
from tfxformer.loaders import (
    CTranslate2Loader,
    EnsembleLoader,
    Loader,
    PresetLoader,
    RunDirLoader,
    SavedModelLoader,
)
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME, RunRecord

__all__ = ["FORMS", "KINDS", "ONE_MODEL", "CTranslate2Loader", "EnsembleLoader", "Loader",
           "PresetLoader", "RunDirLoader", "SavedModelLoader", "describe_forms",
           "is_ctranslate2_dir", "is_model_path", "read_ctranslate2_marker", "resolve",
           "resolve_model_dir", "saved_model_versions", "source_name", "target_languages_of"]


def resolve_model_dir(path):
    """(kind, path) of :func:`resolve`: one of :data:`KINDS` and the directory holding the
    model (a SavedModel's version dir)."""
    source = resolve(path)
    return source.kind, source.path


def target_languages_of(path) -> tuple[str, ...]:
    """The target languages of the multilingual model at `path` (any form,
    :func:`resolve`), or () for a model of one target. Raises as :func:`resolve`."""
    return resolve(path).target_languages


def _listing(path: str) -> str:
    names = sorted(n + ("/" if os.path.isdir(os.path.join(path, n)) else "")
                   for n in os.listdir(path))
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return shown or "nothing (it is empty)"


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
                             os.path.join(path, SPM_FILENAME), record,
                             _names_direction(marker), marker=marker)


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
