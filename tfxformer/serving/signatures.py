"""One signature of a translator, opened from a model on disk: a SavedModel's own, or a run
dir's model wrapped in a :class:`tfxformer.serving.Translator` (the same graph).

What :mod:`tfxformer.serving.scoring` and :mod:`tfxformer.serving.sampling` call; the
translate signatures have their own loader (:func:`tfxformer.serving.load_translate_fn`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfxformer import pretrained
from tfxformer.config import DecodingOptions
from tfxformer.locate import resolve
from tfxformer.models.transformer import Transformer
from tfxformer.rundir import RunRecord
from tfxformer.sentencepiece_ops import load_sentencepiece_ops
from tfxformer.serving.translator import make_translator

__all__ = ["OpenedSignature", "language_inputs", "open_signature"]

_DEFAULTS = DecodingOptions()
# The forms open_signature takes (tfxformer.locate.KINDS).
KINDS = ("saved_model", "run_dir", "preset", "ensemble")


class OpenedSignature(NamedTuple):
    """A translator signature ready to call: `function(**inputs)` -> dict of tensors."""

    function: Callable
    owner: object  # keeps `function` alive: the loaded SavedModel, or the Translator
    path: str  # the version dir, run dir or preset dir opened
    kind: str  # "saved_model", "ensemble", "run_dir" or "preset"
    languages: tuple  # a multilingual model's target languages, else ()
    options: DecodingOptions  # the export's decoding options (a run dir: the defaults)


def open_signature(path, signature, batch_size=_DEFAULTS.batch_size,
                   precision="fp32", checkpoint=None) -> OpenedSignature:
    """Opens `signature` ("score", "translate_sampled", ...) of the model at `path`.

    Args:
        path: a SavedModel version dir, an export dir (its highest version; an ensemble
            export's too), a trained run dir (its averaged checkpoint first) or a preset
            dir of `Transformer.save_to_preset` (a run dir's or preset dir's model is
            wrapped in a Translator with :class:`DecodingOptions`' limits and
            `batch_size` sentences per chunk).
        signature: the signature's name; a SavedModel must have it.
        precision, checkpoint: a run dir's compute type (a preset dir's too) and
            checkpoint prefix (a
            SavedModel computes as it was exported: any other value is an error).

    Raises:
        FileNotFoundError: `path` is no model dir.
        ValueError: an unloadable SavedModel, one exported before `signature` existed
            (naming the command that re-exports it), or an option that does not apply.
    """
    source = resolve(path, KINDS, "open_signature")
    kind, resolved = source.kind, source.path
    if kind in ("run_dir", "preset"):
        model, record, spm_bytes = pretrained.load_source(Transformer, resolved, checkpoint,
                                                          precision, "open_signature")
        translator = make_translator(model, spm_bytes, record.target_languages,
                                     max_batch_size=batch_size,
                                     reverse_target=record.reverse_target)
        return OpenedSignature(getattr(translator, signature), translator, resolved, kind,
                               record.target_languages, translator.options)
    for name, value, default in (("precision", precision, "fp32"),
                                 ("checkpoint", checkpoint, None)):
        if value != default:
            raise ValueError(f"`{name}` {value!r} applies to run dirs; {resolved!r} is "
                             f"{source.what}, which computes as it was exported.")
    load_sentencepiece_ops()
    try:
        loaded = tf.saved_model.load(resolved)
    except (tf.errors.OpError, OSError, ValueError) as err:
        raise ValueError(f"Could not load the SavedModel {resolved!r}: {err}") from None
    if signature not in loaded.signatures:
        raise ValueError(
            f"SavedModel {resolved!r} has no `{signature}` signature (it has "
            f"{sorted(loaded.signatures)}): it was exported before `{signature}` existed. "
            f"Re-export it with scripts/export.py to get the `{signature}` signature: python "
            f"scripts/export.py --model {resolved} --export-dir NEW_EXPORT_DIR")
    record = _exported_record(loaded)
    options = (record.decoding if record else None) or _DEFAULTS
    languages = record.target_languages if record else ()
    return OpenedSignature(loaded.signatures[signature], loaded, resolved, kind, languages,
                           options)


def _exported_record(loaded) -> RunRecord | None:
    """The export's config.json asset as a :class:`RunRecord` (None without one)."""
    asset = getattr(loaded, "config_asset", None)
    if asset is None:
        return None
    with open(asset.asset_path.numpy().decode(), encoding="utf-8") as f:
        return RunRecord.from_dict(json.load(f))


def language_inputs(opened: OpenedSignature, language, size) -> dict:
    """{"target_language": (size,) strings} for a multilingual model, {} for another.

    Raises:
        ValueError: a multilingual model without a known `language` (naming the accepted
            ones), or a `language` for a model of one target.
    """
    if not opened.languages:
        if language is not None:
            raise ValueError(f"`target_language` {language!r} is for a multilingual model; "
                             f"{opened.path!r} has one target language.")
        return {}
    if language not in opened.languages:
        accepted = ", ".join(repr(code) for code in opened.languages)
        raise ValueError(f"{opened.path!r} is a multilingual model: `target_language` must be "
                         f"one of {accepted}, got {language!r}.")
    return {"target_language": tf.fill([size], language)}
