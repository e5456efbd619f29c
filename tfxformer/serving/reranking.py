"""A translator that reranks its own n-best lists in the graph (docs/reranking.md).

:class:`RerankingTranslator` is a :class:`tfxformer.serving.Translator` whose translations
(`serving_default`, `translate_with_options`, `translate_per_example`) are chosen from each
text's n-best list by a weighted sum of scores, all in one TensorFlow graph of stock and
tensorflow-text ops, so a stock TF Serving serves it:

    score(y) = forward_weight * search score(y) + length_weight * |y| (words)
               + sum over rescorers r of r.weight * r's log P(...)

the formula of the Python reranker, :func:`tfxformer.rerank.weighted_sum` and
:func:`tfxformer.rerank.best_index` on tensors, non-finite scores counted as there (the
score names are :data:`tfxformer.rerank.WEIGHTS`).

Each :class:`Rescorer` is another model's translator and its `score` computation
(:meth:`Translator.score_pairs`, with its own vocabulary): "channel" scores the source
given the candidate (a model of the other direction), "forward" the candidate given the
source (a right-to-left model, or another forward model). `translate_nbest`, `score` and
`translate_sampled` stay the forward model's own. MBR needs sentence BLEU, which has no
TensorFlow op: it is reranking's Python side only (:mod:`tfxformer.rerank`).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow.experimental.numpy as tnp

from tfxformer import locate, pretrained
from tfxformer.config import PRECISION_POLICIES
from tfxformer.models.transformer import Transformer
from tfxformer.rerank import GRAPH_WEIGHTS, WEIGHTS, best_index, role_weights, weighted_sum
from tfxformer.serving import flat_rows
from tfxformer.serving.export import export_translator, reading_options, with_source_options
from tfxformer.serving.signatures import check_signatures
from tfxformer.serving.translator import Translator

__all__ = ["RerankingTranslator", "Rescorer", "choose"]

DIRECTIONS = ("channel", "forward")


class Rescorer(NamedTuple):
    """One score of the reranking: `translator` (a :class:`Translator` of the scoring
    model), `direction` ("channel": log P(source | candidate); "forward": log P(candidate
    | source)), `mean` (per scored token instead of the sum), `weight`, and `name` (for
    the export's record)."""

    translator: Translator
    direction: str
    mean: bool
    weight: float
    name: str = ""


class RerankingTranslator(Translator):
    """A :class:`Translator` that picks each translation from its n-best list.

    Args:
        model, sentencepiece_model, **options: as :class:`Translator`'s (the forward
            model, whose beam search makes the n-best lists).
        rescorers: the :class:`Rescorer` scores (their translators' variables are saved
            with the export).
        forward_weight: the weight of the search's own score, log P(y|x) / lp(y).
        length_weight: the weight of |y|, the candidate's words.
        num_hypotheses: candidates per text (default: the beam size; a request's beam size
            below it is raised to it).

    The outputs are :class:`Translator`'s: `translation` the chosen candidate, `score` its
    search score (log P(y|x) / lp(y)), `truncated`.
    """

    def __init__(self, model, sentencepiece_model: bytes, rescorers=(), forward_weight=1.0,
                 length_weight=0.0, num_hypotheses=None, **options):
        super().__init__(model, sentencepiece_model, **options)
        for rescorer in rescorers:
            if rescorer.direction not in DIRECTIONS:
                raise ValueError(f"Rescorer direction {rescorer.direction!r} not in "
                                 f"{DIRECTIONS}.")
            if rescorer.translator.target_languages:
                raise ValueError("A multilingual model cannot rescore (it needs a target "
                                 "language per text).")
        if self.target_languages:
            raise ValueError("Reranking takes a model of one target language.")
        self.rescorers = list(rescorers)
        self.rescoring_translators = [r.translator for r in self.rescorers]  # tracked
        self.forward_weight, self.length_weight = float(forward_weight), float(length_weight)
        self.num_hypotheses = int(num_hypotheses or self.beam_size)
        if self.num_hypotheses < 1:
            raise ValueError(f"num_hypotheses must be >= 1, got {num_hypotheses}.")

    def translate(self, text, beam_size=None, alpha=None, extra_length=None,
                  max_input_tokens=None, target_language=None, sampling=None):
        """:meth:`Translator.translate` with each translation chosen from its n-best list
        (sampling is not reranked)."""
        if sampling is not None:
            return super().translate(text, beam_size, alpha, extra_length, max_input_tokens,
                                     target_language, sampling)
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        beam = tf.maximum(tf.cast(self.beam_size if beam_size is None else beam_size,
                                  tf.int32), self.num_hypotheses)
        out = self.nbest(text, beam, self.alpha if alpha is None else alpha,
                         self.extra_length if extra_length is None else extra_length,
                         self.max_input_tokens if max_input_tokens is None
                         else max_input_tokens, self.num_hypotheses, token_scores=False)
        translations, scores = out["translations"], out["scores"]  # (N, K)
        best = tf.cast(choose(*self.features(text, translations, scores))[1], tf.int32)
        return {"translation": tf.gather(translations, best, batch_dims=1),
                "score": tf.gather(scores, best, batch_dims=1),
                "truncated": out["truncated"]}

    def features(self, text, translations, scores):
        """(features, weights, exists) of the candidates `translations` ((N, K) strings,
        their search `scores`; a slot with no candidate has a non-finite score), as
        :func:`choose` takes them: {name: (N, K) float32} of the weighted scores, their
        weights, and False where the list has no candidate."""
        shape = tf.shape(translations)
        exists = tf.math.is_finite(scores)
        features = {"forward": tf.where(exists, scores, 0.0)}
        weights = {"forward": self.forward_weight, "length": self.length_weight}
        flat = tf.reshape(translations, [-1])  # (N * K,)
        if self.length_weight:
            words = flat_rows.word_counts(flat)
            features["length"] = tf.reshape(tf.cast(words, tf.float32), shape)
        sources = flat_rows.repeat_each(text, shape[1])
        for i, rescorer in enumerate(self.rescorers):
            pair = (flat, sources) if rescorer.direction == "channel" else (sources, flat)
            out = rescorer.translator.score_pairs(*pair)
            value = out["mean_log_prob" if rescorer.mean else "log_prob"]
            features[i], weights[i] = tf.reshape(value, shape), rescorer.weight
        return features, weights, exists

    def combined(self, text, translations, scores):
        """(N, K) combined scores of the candidates (:meth:`features`); -inf where the
        list has no candidate."""
        return choose(*self.features(text, translations, scores))[0]


def choose(features, weights, exists=None):
    """(combined, best) of (N, K) candidate scores in the graph: `features` {name: (N, K)
    float32 tensor}, `weights` {name: weight}; `exists` (N, K) bool, False for a slot
    with no candidate. The Python reranker's :func:`tfxformer.rerank.combine` on tensors:
    the same formula, the same rule for non-finite scores."""
    combined = weighted_sum(features, weights, tnp)
    if exists is not None:
        combined = tf.where(exists, combined, -np.inf)
    return combined, best_index(combined, tnp)


# The list's own scores an export weighs (forward, length).
OWN_WEIGHTS = tuple(name for name in GRAPH_WEIGHTS if WEIGHTS[name].role is None)


def role_of(record, rescoring) -> str:
    """"channel", "right_to_left" or "forward_model": what the model of the
    :class:`RunRecord` `rescoring` scores for the forward model of `record`.

    Raises:
        ValueError: it translates neither the forward model's direction nor the reverse.
    """
    if (rescoring.src, rescoring.tgt) == (record.tgt, record.src):
        return "channel"
    if (rescoring.src, rescoring.tgt) == (record.src, record.tgt):
        return "right_to_left" if rescoring.reverse_target else "forward_model"
    raise ValueError(f"A rescoring model must translate {record.src}->{record.tgt} (a "
                     f"forward or right-to-left model) or {record.tgt}->{record.src} (a "
                     f"channel model); this one translates {rescoring.src}->{rescoring.tgt}.")


def check_weights(weights, roles) -> None:
    """Raises ValueError for a weight name no score of this export has, or a rescoring
    model without a weight (naming the accepted names)."""
    accepted = set(OWN_WEIGHTS) | {name for role in roles for name in role_weights(role)}
    unknown = sorted(set(weights) - accepted)
    if unknown:
        raise ValueError(f"Rerank weights {unknown} name no score of these models; accepted: "
                         f"{sorted(accepted)}.")
    for role in roles:
        if not any(weights.get(name) for name in role_weights(role)):
            raise ValueError(f"The {role.replace('_', '-')} model has no weight: give "
                             f"{' or '.join(role_weights(role))}.")
    if len(set(roles)) < len(roles):
        raise ValueError(f"One rescoring model per role, got roles {roles}.")


def export_reranking(model_path, rescoring_paths, export_dir, weights, num_hypotheses=None,
                     precision="fp32", version=None, num_batch_threads=None,
                     max_batch_size=None, signatures=None, **options):
    """Exports one SavedModel whose translations are reranked in the graph: the model at
    `model_path` makes each text's n-best list (`num_hypotheses` candidates, default the
    beam size; the beam is at least that wide), and each model of `rescoring_paths` scores
    the candidates with its `score` computation. A rescoring model's role comes from its
    record (:func:`role_of`): a channel model translates the other way, a right-to-left
    model (`reverse_target`) or another forward model the same way.

    Args:
        model_path, rescoring_paths: trained models (SavedModels, run dirs, preset dirs:
            :func:`tfxformer.locate.resolve`); each keeps its own vocabulary.
        weights: {name: weight} over "forward" (the search's score), "length" (|y| in
            words) and the rescoring models' (:data:`tfxformer.rerank.WEIGHTS`: "channel",
            "channel_mean", "right_to_left", ...); a name not given weighs 0.
        precision: "fp32" or "bf16", the compute type of every model.
        signatures: the signatures to export
            (:func:`tfxformer.serving.export.export_translator`; None: all).
        options: beam_size, alpha, extra_length, max_input_tokens, max_output_tokens,
            stopping, length_normalization of the forward model's search (unset: its
            export's, as :func:`export_saved_model`); sentence_split, recase
            (:func:`tfxformer.serving.export.export_run_dir`'s).

    The record (config.json) is the forward model's, with `rerank`: the weights, the
    number of candidates and each rescoring model's source, role and vocabulary.
    """
    check_signatures(signatures)
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r} not in ['bf16', 'fp32'].")
    dtype = {} if precision == "fp32" else {"dtype": PRECISION_POLICIES[precision]}
    source = locate.resolve(model_path)
    record = source.record()
    options = with_source_options(record, options)
    sources = [locate.resolve(path) for path in rescoring_paths]
    roles = [role_of(record, s.record()) for s in sources]
    check_weights(weights, roles)
    rescorers, models = [], []
    for path, rescoring, role in zip(rescoring_paths, sources, roles, strict=True):
        scoring = rescoring.record()
        translator = Translator(
            pretrained.load_model(Transformer, path, **dtype), rescoring.spm_bytes,
            max_batch_size=max_batch_size, max_input_tokens=scoring.max_length,
            max_output_tokens=scoring.max_length, reverse_target=scoring.reverse_target)
        for name in role_weights(role):
            if weights.get(name):
                rescorers.append(Rescorer(translator, WEIGHTS[name].direction,
                                          WEIGHTS[name].mean,
                                          float(weights[name]), name))
        models.append({"source": locate.source_name(path), "role": role,
                       "vocabulary_sha256": hashlib.sha256(rescoring.spm_bytes).hexdigest()})
    limits = {name: options.pop(name, None) or record.max_length
              for name in ("max_input_tokens", "max_output_tokens")}
    reading = reading_options(record, options.pop("sentence_split", True),
                              options.pop("recase", True), options.pop("markup", True))
    translator = RerankingTranslator(
        pretrained.load_model(Transformer, model_path, **dtype), source.spm_bytes, rescorers,
        forward_weight=weights.get("forward", 0.0), length_weight=weights.get("length", 0.0),
        num_hypotheses=num_hypotheses, max_batch_size=max_batch_size,
        reverse_target=record.reverse_target, reading=reading, **limits, **options)
    translator.rerank_info = {"hypotheses": translator.num_hypotheses,
                              "weights": {k: float(v) for k, v in weights.items()},
                              "models": models}
    return export_translator(translator, export_dir, config=record, version=version,
                             num_batch_threads=num_batch_threads, signatures=signatures)
