"""One signature of a translator, opened from a model on disk: a SavedModel's own, or a run
dir's model wrapped in a :class:`tfxformer.serving.Translator` (the same graph).

What :mod:`tfxformer.serving.scoring` and :mod:`tfxformer.serving.sampling` call; the
translate signatures have their own loader (:func:`tfxformer.serving.load_translate_fn`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfxformer.config import DecodingOptions
from tfxformer.locate import resolve
from tfxformer.models.transformer import Transformer
from tfxformer.serving.multilingual_translator import make_translator
from tfxformer.serving.reading import ReadingOptions

__all__ = ["SIGNATURES", "OpenedSignature", "SignatureOpener", "check_signatures",
           "language_inputs", "missing_signature", "open_signature"]

_DEFAULTS = DecodingOptions()
# The signatures an export may hold (scripts/export.py --signatures), in the order it saves
# them, each with what a client calls it for.
SIGNATURES = {
    "serving_default": "the export's own decoding options; TF Serving's default (always "
                       "exported)",
    "translate_per_example": "beam size, alpha, extra length, input limit per text "
                             "(batchable)",
    "translate_with_options": "the same per request, as scalars (scripts/translate.py "
                              "--beam-size/--alpha/--extra-length)",
    "translate_sampled": "sampled translations (scripts/translate.py --sampling-topk)",
    "translate_nbest": "n-best lists, repetition control, target prefixes, constraints "
                       "(scripts/translate.py --n-best and its steering flags; the "
                       "largest graph)",
    "score": "log P(target | text) of given translations (scripts/score.py)",
}
# The forms open_signature takes (tfxformer.locate.KINDS but CTranslate2's: no graph).
KINDS = ("saved_model", "run_dir", "preset", "ensemble")


def check_signatures(names) -> tuple[str, ...]:
    """The signatures an export asked for `names` holds, in :data:`SIGNATURES`' order:
    all of them for None, else `names` (a sequence of names) and `serving_default`.

    Raises:
        ValueError: a name not in :data:`SIGNATURES` (naming it and the accepted ones), or
            `names` a single string rather than a sequence of names.
    """
    if names is None:
        return tuple(SIGNATURES)
    if isinstance(names, (str, bytes)):
        raise ValueError(f"`signatures` takes a sequence of signature names, got the string "
                         f"{names!r}; e.g. [{names!r}].")
    names = list(names)
    unknown = [name for name in names if name not in SIGNATURES]
    if unknown:
        raise ValueError(f"Unknown signature name(s) {unknown}; accepted: "
                         f"{', '.join(SIGNATURES)}.")
    return tuple(name for name in SIGNATURES if name in names or name == "serving_default")


def missing_signature(path, signature, available, record=None) -> ValueError:
    """The error for the SavedModel at `path` without `signature` (its signatures are
    `available`): exported with `scripts/export.py --signatures` leaving it out (its
    config.json record lists `signatures`), or before `signature` existed. It names the
    command that re-exports the model with `signature` and the ones it has."""
    exported = (record.export.get("signatures") if record is not None else None)
    wanted = [name for name in SIGNATURES if name in available or name == signature]
    if exported is not None:
        why = f"it was exported with `--signatures {' '.join(exported)}`"
    else:
        why = f"it was exported before `{signature}` existed"
    flag = "" if len(wanted) == len(SIGNATURES) else f" --signatures {' '.join(wanted)}"
    made = record.export if record is not None else {}
    if made.get("ensemble") or made.get("rerank"):  # --model would drop the other models
        entry, how = (("ensemble", "--ensemble MODEL MODEL ...") if made.get("ensemble")
                      else ("rerank", "--model MODEL --rerank-with MODEL ... --rerank-weight "
                                      "NAME=VALUE ..."))
        command = (f"python scripts/export.py {how} --export-dir NEW_EXPORT_DIR{flag} (as "
                   f"its assets/config.json `{entry}` entry records)")
    else:
        command = f"python scripts/export.py --model {path} --export-dir NEW_EXPORT_DIR{flag}"
    return ValueError(
        f"SavedModel {path!r} has no `{signature}` signature (it has {sorted(available)}): "
        f"{why}. Re-export it with scripts/export.py to get the `{signature}` signature: "
        f"{command}")


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
        precision, checkpoint: a run dir's compute type (a preset dir's too; "auto" as
            :func:`tfxformer.serving.load_translate_fn`) and checkpoint prefix (a
            SavedModel computes as it was exported: any other value is an error).

    Raises:
        FileNotFoundError: `path` is no model dir.
        ValueError: an unloadable SavedModel, one without `signature` (exported before
            it existed, or with `scripts/export.py --signatures` leaving it out;
            :func:`missing_signature` names the command that re-exports it), or an option
            that does not apply.
    """
    return resolve(path, KINDS, "open_signature").open(
        SignatureOpener(signature, batch_size), precision, checkpoint)


class SignatureOpener:
    """What :func:`open_signature` makes of each form's contents
    (:meth:`tfxformer.locate.Loader.open`): the :class:`OpenedSignature` of `signature`,
    a run dir's or preset dir's model in a Translator of `batch_size` sentences per
    chunk."""

    model_class = Transformer

    def __init__(self, signature: str, batch_size=_DEFAULTS.batch_size):
        self.signature, self.batch_size = signature, batch_size

    def from_model(self, loader, model) -> OpenedSignature:
        record = loader.record()
        translator = make_translator(model, loader.spm_bytes, record.target_languages,
                                     max_batch_size=self.batch_size,
                                     reverse_target=record.reverse_target,
                                     reading=ReadingOptions(language=record.src))
        return OpenedSignature(getattr(translator, self.signature), translator, loader.path,
                               loader.kind, record.target_languages, translator.options)

    def from_saved_model(self, loader, loaded) -> OpenedSignature:
        record = loader.record()
        if self.signature not in loaded.signatures:
            raise missing_signature(loader.path, self.signature, loaded.signatures, record)
        return OpenedSignature(loaded.signatures[self.signature], loaded, loader.path,
                               loader.kind, record.target_languages,
                               record.decoding or _DEFAULTS)


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
