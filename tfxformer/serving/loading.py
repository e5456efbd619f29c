"""One way from a model on disk to a translate function: SavedModel (one model's, an
ensemble's), export dir, run dir, preset dir or CTranslate2 dir.

An export dir holds SavedModels in integer version subdirectories
`<export-dir>/<version>/saved_model.pb`, as TF Serving expects; a run dir is what training
writes (:mod:`tfxformer.rundir`); a preset dir what `Transformer.save_to_preset` writes; a
CTranslate2 dir what `scripts/export.py --format ctranslate2` writes.
:func:`load_translate_fn` takes any of them (:func:`tfxformer.locate.resolve` gives the
loader of each, which hands what it holds to :data:`TRANSLATING`) and returns a function
`list[str] -> list[str]`; :func:`make_translate_fn` gives the same for a model in memory
(validation during training).
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.locate import (  # noqa: F401 (re-exported by tfxformer.serving)
    KINDS,
    resolve,
    resolve_model_dir,
    saved_model_versions,
    target_languages_of,
)
from tfxformer.models.transformer import Transformer
from tfxformer.serving.batching import translate_in_length_order
from tfxformer.serving.ctranslate2 import Ct2NBestFn, load_ct2_translate_fn
from tfxformer.serving.multilingual_translator import make_translator
from tfxformer.serving.nbest import NBestFn
from tfxformer.serving.reading import ReadingOptions
from tfxformer.serving.signatures import SignatureOpener, missing_signature

_DEFAULTS = DecodingOptions()


class TranslateFn:
    """`translate(lines) -> list[str]`: one translation per line (str or UTF-8 bytes), in
    order. Lines are sorted by length and translated `batch_size` at a time.

    Attributes: `path` (what was loaded), `kind` ("saved_model", "ensemble", "run_dir",
    "preset" or "model"),
    `options` (the beam_size, alpha and extra_length it decodes with).
    """

    def __init__(self, function, owner, path, kind, options, batch_size):
        batch_size = checks.integer(batch_size, "batch_size", 1)
        self._function, self._owner = function, owner  # tf.functions hold theirs weakly
        self.path, self.kind, self.options = path, kind, dict(options)
        self.batch_size = int(batch_size)

    def __call__(self, lines) -> list[str]:
        return translate_in_length_order(self._translate_batch, list(lines), self.batch_size)

    def _translate_batch(self, lines):
        out = self._function(tf.constant(lines, tf.string))
        return [t.decode("utf-8") for t in out["translation"].numpy()]

    def describe(self) -> str:
        """One line for a log: the model and its decoding options."""
        options = self.options
        return (f"model: {self.path} ({self.kind.replace('_', ' ')}); beam size "
                f"{options['beam_size']}, alpha {options['alpha']}, extra length "
                f"{options['extra_length']}, stopping {options.get('stopping')}, length "
                f"normalization {options.get('length_normalization')}")


def make_translate_fn(model, spm_bytes: bytes, beam_size=None, alpha=None,
                      extra_length=None, batch_size=_DEFAULTS.batch_size, path=None,
                      target_languages=(), target_language=None, stopping=None,
                      length_normalization=None, reverse_target=False, kind=None,
                      reading=None):
    """A :class:`TranslateFn` over a Transformer in memory and its vocabulary `spm_bytes`,
    translating with the exported graph (:class:`tfxformer.serving.Translator`); a
    multilingual model's (`target_languages`) into `target_language`; a right-to-left
    model's (`reverse_target`) pieces put back in reading order. `path`, `kind`: where
    it was loaded from (:data:`tfxformer.locate.KINDS`; default "run_dir" with a path).
    `reading`: how texts are read (:class:`tfxformer.serving.reading.ReadingOptions`;
    None: an export's default, generic sentence rules)."""
    decoding = _DEFAULTS.replace(beam_size=beam_size, alpha=alpha, extra_length=extra_length,
                                 stopping=stopping, length_normalization=length_normalization)
    options = _search_options(decoding)
    translator = make_translator(model, spm_bytes, target_languages,
                                 max_batch_size=batch_size, reverse_target=reverse_target,
                                 reading=reading, **options)
    function = _into(translator.__call__, target_languages, target_language,
                     path or "the model")
    return TranslateFn(function, translator, path or "model in memory",
                       kind or ("run_dir" if path else "model"), options, batch_size)


def _into(function, languages, language, path):
    """`function(text)` of a one-target model, or a multilingual model's `function(text,
    target_language)` with `language` for every text; ValueError for a missing, unknown
    or unneeded `language`."""
    if not languages:
        if language is not None:
            raise ValueError(f"`target_language` {language!r} is for a multilingual model; "
                             f"{path!r} has one target language.")
        return function
    if language not in languages:
        accepted = ", ".join(repr(code) for code in languages)
        raise ValueError(f"{path!r} is a multilingual model: `target_language` must be one "
                         f"of {accepted}, got {language!r}.")
    return lambda text: function(text, tf.fill(tf.shape(text), language))


def _search_options(decoding: DecodingOptions) -> dict:
    """The options a translator searches with: the call's three and the two an export
    fixes (stopping rule, length normalization)."""
    return dict(decoding.search_options(), stopping=decoding.stopping,
                length_normalization=decoding.length_normalization)


def load_translate_fn(path, beam_size=None, alpha=None, extra_length=None, batch_size=None,
                      precision="fp32", checkpoint=None, target_language=None, stopping=None,
                      length_normalization=None, compute_type=None, threads=None):
    """The translate function of a trained model on disk, of any form.

    Args:
        path: a SavedModel version dir, an export dir (its highest version is taken; an
            ensemble export's too), a trained run dir (its averaged checkpoint first,
            :func:`tfxformer.pretrained.load_run_dir`), a preset dir of
            `Transformer.save_to_preset` (its model and spm.model in a Translator, as a
            run dir's) or a CTranslate2 dir of this package
            (:func:`tfxformer.serving.ctranslate2.load_ct2_translate_fn`).
        beam_size, alpha, extra_length: decoding options (§6.1); None takes the export's
            (its config.json asset), else :class:`tfxformer.config.DecodingOptions`'
            (the paper's 4, 0.6, 50).
        batch_size: sentences per translation call (None: a CTranslate2 dir's own, else
            :class:`tfxformer.config.DecodingOptions`').
        precision: compute type of a run dir's or preset dir's model ("fp32", "bf16",
            "fp16", or "auto": bf16 where this CPU has AVX512_BF16 or AMX, else fp32,
            :func:`tfxformer.precision.resolve`); a SavedModel computes in the type it was
            exported with ("auto" accepts that).
        checkpoint: a run dir's checkpoint prefix (default:
            :func:`tfxformer.rundir.find_checkpoint`).
        target_language: the language a multilingual model translates into (one of its
            `target_languages`; required for such a model, an error for any other).
        stopping, length_normalization: beam search's stopping rule and length
            normalization (:class:`tfxformer.config.DecodingOptions`); a SavedModel fixes
            both when exported, so for one they may only repeat its own.
        compute_type, threads: a CTranslate2 dir's
            (:func:`tfxformer.serving.ctranslate2.load_ct2_translate_fn`; None: its
            "default" type, the cores this process may use).

    Returns:
        A :class:`TranslateFn` (a CTranslate2 dir's:
        :class:`tfxformer.serving.ctranslate2.Ct2TranslateFn`), `list[str] -> list[str]`.

    Raises:
        FileNotFoundError: `path` is no model dir, or a run dir lacks a file.
        ValueError: an unloadable SavedModel, one without the signature it needs
            (`serving_default`; `translate_with_options` for beam_size, alpha or
            extra_length; the message names the re-export command), or an option that
            does not apply to its form.
        ImportError: a CTranslate2 dir without CTranslate2 installed.
    """
    return resolve(path, KINDS, "load_translate_fn").open(
        TRANSLATING, precision, checkpoint, beam_size=beam_size, alpha=alpha,
        extra_length=extra_length, batch_size=batch_size, target_language=target_language,
        stopping=stopping, length_normalization=length_normalization,
        compute_type=compute_type, threads=threads)


class _Translating:
    """What :func:`load_translate_fn` makes of each form's contents
    (:meth:`tfxformer.locate.Loader.open`): the runtime of translation."""

    model_class = Transformer

    @staticmethod
    def from_model(loader, model, beam_size=None, alpha=None, extra_length=None,
                   batch_size=None, target_language=None, stopping=None,
                   length_normalization=None):
        """A run dir's or preset dir's model, translating with the exported graph."""
        record = loader.record()
        return make_translate_fn(model, loader.spm_bytes, beam_size, alpha, extra_length,
                                 batch_size or _DEFAULTS.batch_size, path=loader.path,
                                 kind=loader.kind, target_languages=record.target_languages,
                                 target_language=target_language, stopping=stopping,
                                 length_normalization=length_normalization,
                                 reverse_target=record.reverse_target,
                                 reading=ReadingOptions(language=record.src))

    @staticmethod
    def from_saved_model(loader, loaded, beam_size=None, alpha=None, extra_length=None,
                         batch_size=None, target_language=None, stopping=None,
                         length_normalization=None):
        """A SavedModel's `serving_default` (`translate_with_options` for options)."""
        path, record = loader.path, loader.record()
        if "serving_default" not in loaded.signatures:
            raise missing_signature(path, "serving_default", loaded.signatures, record)
        given = dict(beam_size=beam_size, alpha=alpha, extra_length=extra_length)
        exported = record.decoding or DecodingOptions.from_dict({})
        for name, value in (("stopping", stopping),
                            ("length_normalization", length_normalization)):
            if value is not None and value != getattr(exported, name):
                raise ValueError(
                    f"`{name}` {value!r}: the SavedModel {path!r} was exported with "
                    f"{getattr(exported, name)!r}, fixed in its graph; re-export it with "
                    f"scripts/export.py --{name.replace('_', '-')} {value}.")
        options = _search_options(exported.replace(**given))
        scalars = {}
        if all(v is None for v in given.values()):
            signature = loaded.signatures["serving_default"]
        else:  # an export made with --signatures may lack it
            if "translate_with_options" not in loaded.signatures:
                raise missing_signature(path, "translate_with_options", loaded.signatures,
                                        record)
            signature = loaded.signatures["translate_with_options"]
            scalars = dict(beam_size=tf.constant(options["beam_size"], tf.int32),
                           alpha=tf.constant(options["alpha"], tf.float32),
                           extra_length=tf.constant(options["extra_length"], tf.int32))

        def function(text, *target_language):  # a multilingual export's take both
            language = {"target_language": target_language[0]} if target_language else {}
            return signature(text=text, **language, **scalars)

        return TranslateFn(_into(function, record.target_languages, target_language, path),
                           loaded, path, loader.kind, options,
                           batch_size or _DEFAULTS.batch_size)

    @staticmethod
    def from_ctranslate2(loader, beam_size=None, alpha=None, extra_length=None,
                         batch_size=None, compute_type=None, threads=None):
        """A CTranslate2 dir, translating with CTranslate2."""
        return load_ct2_translate_fn(loader.path, beam_size, alpha, extra_length, batch_size,
                                     compute_type or "default", threads)


# The runtime of translation (Loader.open).
TRANSLATING = _Translating()


def load_nbest_fn(path, num_hypotheses=None, beam_size=None, alpha=None, extra_length=None,
                  batch_size=None, precision="fp32", checkpoint=None, target_language=None,
                  no_repeat_ngram_size=None, repetition_penalty=None, compute_type=None,
                  threads=None):
    """The n-best function of a trained model on disk, of any form.

    Args:
        path: a SavedModel (version or export dir) with the `translate_nbest` signature, a
            trained run dir (its averaged checkpoint first), a preset dir, or a CTranslate2
            dir (:class:`tfxformer.serving.ctranslate2.Ct2NBestFn`).
        num_hypotheses: translations per line, at most the beam size (None: the beam size).
        beam_size, alpha, extra_length: decoding options (None: the export's, else
            :class:`DecodingOptions`').
        batch_size, precision, checkpoint, target_language, compute_type, threads: as
            :func:`load_translate_fn`'s.
        no_repeat_ngram_size, repetition_penalty: repetition control (None: off, 0 and
            1.0; :class:`DecodingOptions`; CTranslate2's own options of those names).

    Returns:
        An :class:`tfxformer.serving.NBestFn` (a CTranslate2 dir's:
        :class:`tfxformer.serving.ctranslate2.Ct2NBestFn`).

    Raises:
        FileNotFoundError: `path` is no model dir.
        ValueError: a bad option (`num_hypotheses` above the beam size, an option of
            another form), or a SavedModel without `translate_nbest` (exported before it
            existed: re-export it with scripts/export.py).
    """
    return resolve(path, KINDS, "load_nbest_fn").open(
        NBEST_LISTS, precision, checkpoint, num_hypotheses=num_hypotheses,
        beam_size=beam_size, alpha=alpha, extra_length=extra_length, batch_size=batch_size,
        target_language=target_language, no_repeat_ngram_size=no_repeat_ngram_size,
        repetition_penalty=repetition_penalty, compute_type=compute_type, threads=threads)


class _NBestLists:
    """What :func:`load_nbest_fn` makes of each form's contents
    (:meth:`tfxformer.locate.Loader.open`)."""

    model_class = Transformer

    def from_model(self, loader, model, batch_size=None, **options):
        opener = SignatureOpener("translate_nbest", batch_size or _DEFAULTS.batch_size)
        return self._nbest(opener.from_model(loader, model), opener.batch_size, **options)

    def from_saved_model(self, loader, loaded, batch_size=None, **options):
        opener = SignatureOpener("translate_nbest", batch_size or _DEFAULTS.batch_size)
        return self._nbest(opener.from_saved_model(loader, loaded), opener.batch_size,
                           **options)

    @staticmethod
    def _nbest(opened, batch_size, num_hypotheses=None, target_language=None, **decoding):
        options = opened.options.replace(**decoding).validate()
        count = options.beam_size if num_hypotheses is None else num_hypotheses
        return NBestFn(opened, options, count, batch_size, target_language)

    @staticmethod
    def from_ctranslate2(loader, num_hypotheses=None, beam_size=None, alpha=None,
                         extra_length=None, batch_size=None, compute_type=None, threads=None,
                         no_repeat_ngram_size=None, repetition_penalty=None):
        translate = _Translating.from_ctranslate2(loader, beam_size, alpha, extra_length,
                                                  batch_size, compute_type, threads)
        translate.decoding = translate.decoding.replace(
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty).validate()
        return Ct2NBestFn(translate, num_hypotheses)


# The runtime of n-best lists (Loader.open).
NBEST_LISTS = _NBestLists()
