"""The forms a trained model of this package takes on disk: their files, names and
descriptions (:data:`FORMS`), read by :mod:`tfxformer.locate` and its loaders
(:mod:`tfxformer.loaders`). File names and JSON only.
"""

from __future__ import annotations

import json
import os

from tfxformer.config import PRESETS
from tfxformer.rundir import CONFIG_FILENAME, SPM_FILENAME

__all__ = ["CT2_FILES", "CT2_FORMAT", "CT2_FORMAT_VERSION", "CT2_MARKER_FILENAME", "FORMS",
           "KINDS", "METADATA_FILENAME", "ONE_MODEL", "REGISTERED_NAME", "WEIGHTS_FILENAME",
           "describe_forms", "is_ctranslate2_dir", "is_model_path", "read_ctranslate2_marker",
           "read_json", "saved_model_versions", "source_name"]

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


def source_name(path) -> str:
    """A model's name for a record: its path's last component ("en_de/3" for a
    SavedModel version dir), so that no machine path goes into the record."""
    parts = os.path.normpath(os.path.abspath(os.fspath(path))).split(os.sep)
    return "/".join(parts[-2:]) if parts[-1].isdigit() else parts[-1]


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


def is_model_path(name) -> bool:
    """Whether `name` (given to `from_preset`) means a directory rather than a preset: a
    path object, or a string that is no preset name and holds a "/" or exists."""
    if isinstance(name, os.PathLike):
        return True
    return isinstance(name, str) and name not in PRESETS and (
        os.sep in name or "/" in name or os.path.exists(name))
