"""One loader per form of trained model (keras-hub's preset loaders): what each form
holds and how it loads, so that no caller branches on the form. :func:`tfxformer.locate.resolve`
gives the loader of a path.

A loader reads its records, loads one model's weights into a class it is handed
(:meth:`Loader.load_model`, :mod:`tfxformer.weights`) and hands what its form holds to
the caller's runtime (:meth:`Loader.open`): the model and tokenizer classes, the
translators and what builds them sit above this module, which imports none of them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import tensorflow as tf

from tfxformer import precision as machine_precision
from tfxformer import rundir, weights
from tfxformer.config import ModelConfig
from tfxformer.forms import CT2_FILES, ONE_MODEL, WEIGHTS_FILENAME, describe_forms
from tfxformer.rundir import SPM_FILENAME, RunRecord
from tfxformer.sentencepiece_ops import load_sentencepiece_ops

__all__ = ["CT2_OPTIONS", "CTranslate2Loader", "EnsembleLoader", "Loader", "PresetLoader",
           "RunDirLoader", "SavedModelLoader"]


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
        what = self.described
        if self.target_languages:
            what = (f"a multilingual {what.split(' ', 1)[1]} "
                    f"({', '.join(self.target_languages)})")
        return what

    @property
    def described(self) -> str:
        """What it is, of one target language."""
        return self.noun

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
    def described(self) -> str:
        averaged = os.path.isdir(os.path.join(self.path, rundir.AVERAGED))
        return "an averaged run dir" if averaged else self.noun

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
    def described(self) -> str:
        members = [m for m in self.run_record.export.get("ensemble") or ()
                   if isinstance(m, dict)]
        return (f"{self.noun} of {len(members)} models ("
                + ", ".join(str(m.get("source")) for m in members) + ")")

    def weights_file(self) -> str:
        raise self._not_one_model()

    def load_model(self, cls, precision=None, checkpoint=None):
        raise self._not_one_model()


@dataclasses.dataclass(frozen=True)
class CTranslate2Loader(Loader):
    """A CTranslate2 dir of this package (model.bin, config.json, spm.model,
    tfxformer.json); `marker`: its tfxformer.json record as read when the path was
    resolved (the runtime takes it from here, not from the file again)."""

    kind, noun = "ctranslate2", "a CTranslate2 dir"
    lacks: ClassVar[dict] = {
        "constraints": "and CTranslate2 has no terminology constraints",
        "token_scores": "whose translate_batch gives each hypothesis' score but not each "
                        "token's log-probability (only the whole vocabulary's logits)",
        "alignments": "and word alignments are read from the SavedModel's translate_nbest "
                      "graph"}

    marker: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

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
