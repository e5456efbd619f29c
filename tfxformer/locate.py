"""Finding a trained model on disk: what a directory holds, read as far as its config.

A trained model of this package is any of:

* a SavedModel export dir (``saved_models/<name>``: integer version subdirs, the highest
  is taken) or one of its version dirs (``saved_model.pb``, ``assets/config.json``,
  ``assets/spm.model``), as ``scripts/export.py`` and training's ``--export-dir`` write;
* a run dir of ``scripts/train_wmt.py`` (``config.json``, ``spm.model``, checkpoints;
  :mod:`tfxformer.rundir`);
* a preset dir of ``Transformer.save_to_preset`` (the keras-hub layout: ``config.json``,
  ``model.weights.h5``, ``spm.model``, ``metadata.json``).

This module only reads file names and JSON: it builds nothing, so that everything that
builds (:mod:`tfxformer.pretrained`, the model and tokenizer classes, serving) sits above
it.
"""

from __future__ import annotations

import dataclasses
import json
import os

from tfxformer import rundir
from tfxformer.config import PRESETS, ModelConfig
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME, RunRecord

__all__ = ["KINDS", "Source", "is_model_path", "read_record", "resolve", "resolve_model_dir",
           "saved_model_versions", "target_languages_of"]

WEIGHTS_FILENAME = "model.weights.h5"
METADATA_FILENAME = "metadata.json"
REGISTERED_NAME = "tfxformer>Transformer"
KINDS = ("preset", "saved_model", "run_dir")
ACCEPTED = ("a SavedModel export dir of tfxformer (integer version subdirs) or one of its "
            "version dirs (saved_model.pb, assets/config.json, assets/spm.model), a run dir "
            f"of scripts/train_wmt.py ({CONFIG_FILENAME}, {SPM_FILENAME}, checkpoints/), or "
            f"a preset dir of Transformer.save_to_preset ({CONFIG_FILENAME}, "
            f"{WEIGHTS_FILENAME}, {SPM_FILENAME})")


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


def read_record(kind: str, path: str) -> RunRecord | None:
    """The :class:`RunRecord` of a run dir's config.json (`kind` "run_dir") or of a
    SavedModel version dir's config.json asset (an ensemble export's included), or None
    where there is none."""
    config = os.path.join(path, *(() if kind == "run_dir" else ("assets",)), CONFIG_FILENAME)
    if not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        return RunRecord.from_dict(json.load(f))


def target_languages_of(path) -> tuple[str, ...]:
    """The target languages of the multilingual model at `path` (a SavedModel version or
    export dir, or a run dir; read from its config.json), or () for a model of one target.
    Raises FileNotFoundError as :func:`resolve_model_dir`."""
    record = read_record(*resolve_model_dir(path))
    return () if record is None else record.target_languages


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

    def record(self) -> RunRecord:
        """Its :class:`RunRecord`: a run dir's config.json, a SavedModel's config asset, or
        a preset dir's model and preset."""
        if self.kind == "preset":
            return RunRecord(model=self.model, preset=self.preset)
        return read_record(self.kind, self.path)

    @property
    def label(self) -> str:
        """The source for messages: its kind and path."""
        return f"{self.kind.replace('_', ' ')} {self.path!r}"


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
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path!r} does not exist; expected {ACCEPTED}.")
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is a file, not a model directory; expected {ACCEPTED}.")
    config_path = os.path.join(path, CONFIG_FILENAME)
    if os.path.isfile(os.path.join(path, WEIGHTS_FILENAME)) and os.path.isfile(config_path):
        config = read_json(config_path, "the config.json of Transformer.save_to_preset")
        if config.get("registered_name") != REGISTERED_NAME:
            raise ValueError(f"{config_path} describes {config.get('registered_name')!r}, "
                             f"not {REGISTERED_NAME!r}: not a preset of this package.")
        return Source("preset", path, _model_of(config, config_path, "config"),
                      config.get("preset"), os.path.join(path, SPM_FILENAME))
    try:
        kind, resolved = resolve_model_dir(path)
    except FileNotFoundError:
        raise ValueError(f"{path!r} is not a model of this package: it holds "
                         f"{_listing(path)}; expected {ACCEPTED}.") from None
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
    config = read_json(wanted[0], "the config.json asset of a tfxformer export")
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
