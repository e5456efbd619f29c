"""Sampled translations from Python: one draw from the model per line, reproducible per seed.

Back-translation from sampled outputs trains better models than from beam outputs
(Edunov et al., 2018). :func:`load_sample_fn` opens a SavedModel's `translate_sampled`
signature, or a run dir's model through the same graph
(:mod:`tfxformer.decoding.sampling`), and returns `sample(lines) -> list[str]`.

    from tfxformer.serving import load_sample_fn
    sample = load_sample_fn("saved_models/en_de", sampling_topk=10, seed=1)
    sample(["A dog runs.", "Two men talk."])
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.serving.batching import translate_in_length_order
from tfxformer.serving.signatures import OpenedSignature, language_inputs, open_signature

__all__ = ["SampleFn", "call_seed", "load_sample_fn"]

_DEFAULTS = DecodingOptions()


def call_seed(seed: int, call: int) -> int:
    """The seed (an int in [0, 2^63)) the `translate_sampled` signature gets for call
    number `call` (0, 1, ...) of a :class:`SampleFn` made with `seed`: numpy's
    `SeedSequence` of (seed, call), so the calls draw independently."""
    state = np.random.SeedSequence([seed, call]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


class SampleFn:
    """`sample(lines) -> list[str]`: one sampled translation per line, in order. Lines are
    sorted by length and sampled `batch_size` at a time; call k of the signature draws
    with :func:`call_seed` (seed, k), so the same seed, lines and batch size give the same
    translations, and each batch draws afresh.

    Attributes: `path`, `kind`, `options` (a :class:`DecodingOptions` with the sampling
    options and `extra_length`), `seed`.
    """

    def __init__(self, opened: OpenedSignature, options: DecodingOptions, seed,
                 batch_size=_DEFAULTS.batch_size, target_language=None):
        self.batch_size = checks.integer(batch_size, "batch_size", 1)
        self.seed = checks.integer(seed, "seed", 0)
        language_inputs(opened, target_language, 0)  # a bad language fails here, not later
        self._opened, self._language, self._calls = opened, target_language, 0
        self.path, self.kind, self.options = opened.path, opened.kind, options

    def __call__(self, lines) -> list[str]:
        return translate_in_length_order(self._sample_batch, list(lines), self.batch_size)

    def _sample_batch(self, lines):
        options = self.options
        out = self._opened.function(
            text=tf.constant(lines, tf.string),
            **language_inputs(self._opened, self._language, len(lines)),
            sampling_topk=tf.constant(options.sampling_topk, tf.int32),
            sampling_temperature=tf.constant(options.sampling_temperature, tf.float32),
            sampling_topp=tf.constant(options.sampling_topp, tf.float32),
            extra_length=tf.constant(options.extra_length, tf.int32),
            seed=tf.constant(call_seed(self.seed, self._calls), tf.int64))
        self._calls += 1
        return [t.decode("utf-8") for t in out["translation"].numpy()]

    def describe(self) -> str:
        """One line for a log: the model and its sampling options."""
        o = self.options
        return (f"model: {self.path} ({self.kind.replace('_', ' ')}); sampling top-k "
                f"{o.sampling_topk}, temperature {o.sampling_temperature}, top-p "
                f"{o.sampling_topp}, extra length {o.extra_length}, seed {self.seed}")


def load_sample_fn(path, sampling_topk, sampling_temperature=_DEFAULTS.sampling_temperature,
                   sampling_topp=_DEFAULTS.sampling_topp, seed=None, extra_length=None,
                   batch_size=_DEFAULTS.batch_size, precision="fp32", checkpoint=None,
                   target_language=None) -> SampleFn:
    """The sampling translate function of a SavedModel version dir, its export dir, or a
    run dir.

    Args:
        path: a SavedModel (version or export dir) with the `translate_sampled` signature,
            or a trained run dir (its averaged checkpoint first).
        sampling_topk: K > 1, draw from the K most probable tokens; 0, from the whole
            vocabulary; 1, the argmax (greedy).
        sampling_temperature: divides the logits first (> 0).
        sampling_topp: nucleus sampling, the most probable tokens up to this mass (1: all).
        seed: an int >= 0 (required): the same seed, lines and batch size reproduce the
            translations.
        extra_length: output tokens beyond the source length (None: the export's, else
            :class:`DecodingOptions`').
        batch_size, precision, checkpoint, target_language: as
            :func:`tfxformer.serving.load_translate_fn`'s.

    Returns:
        A :class:`SampleFn`.

    Raises:
        FileNotFoundError: `path` is no model dir.
        ValueError: a bad option, no seed, or a SavedModel without `translate_sampled`
            (exported before it existed: re-export it with scripts/export.py).
    """
    if seed is None:
        raise ValueError("Sampling needs a `seed` (an int >= 0): the same seed, lines and "
                         "batch size give the same translations.")
    checks.integer(seed, "seed", 0)
    options = DecodingOptions(beam_size=1, sampling_topk=sampling_topk,
                              sampling_temperature=sampling_temperature,
                              sampling_topp=sampling_topp)
    opened = open_signature(path, "translate_sampled", batch_size, precision, checkpoint)
    extra = opened.options.extra_length if extra_length is None else extra_length
    options = options.replace(extra_length=extra)
    return SampleFn(opened, options, seed, batch_size, target_language)
