"""Ensemble decoding: several Transformers score each step of one search together.

As fairseq's `EnsembleModel`, Marian's and OpenNMT-py's ensembles: every member encodes
the source itself and keeps its own key/value cache; each step runs every member's
`decode_step` and scores the next token with the average of the members' probabilities,

    log p(y | ...) = logsumexp_i log_softmax(logits_i) - log N     (N members),

float32 log-probabilities, which the searches' own log_softmax
(:func:`tfxformer.decoding.common.next_token_log_probs`) leaves unchanged. The members
share the vocabulary; their output limits are those of the smallest position table.

Shapes: B batch, N rows of the step function (B * beams), V vocabulary.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding.adapter import transformer_decoder
from tfxformer.decoding.common import DEFAULTS, DecodeStart


def members(model):
    """`model` as a list of Transformers: a list or tuple as given (at least one), any
    other value as the one model."""
    if not isinstance(model, (list, tuple)):
        return [model]
    if not model:
        raise ValueError("An ensemble needs at least one model, got an empty "
                         f"{type(model).__name__}.")
    return list(model)


def check_members(models):
    """Raises ValueError unless every model of `models` has the first one's vocabulary
    size (their logits must score the same tokens); returns the smallest position-table
    size, the ensemble's cap on output tokens."""
    sizes = [int(m.model_config.vocab_size) for m in models]
    if len(set(sizes)) > 1:
        raise ValueError(f"The models of an ensemble must share one vocabulary; their "
                         f"vocabulary sizes are {sizes}.")
    return min(int(m.model_config.max_positions) for m in models)


def decoder(model, source_ids, beams=1, extra_length=DEFAULTS.extra_length,
            max_output_length=None, static_cache=False, shortlist=None):
    """The :class:`DecodeStart` of one model (:func:`transformer_decoder`) or of a list or
    tuple of models (:func:`ensemble_decoder`; a list of one is that model)."""
    models = members(model)
    if len(models) == 1:
        return transformer_decoder(models[0], source_ids, beams, extra_length,
                                   max_output_length, static_cache, shortlist)
    return ensemble_decoder(models, source_ids, beams, extra_length, max_output_length,
                            static_cache, shortlist)


def ensemble_log_probs(logits):
    """Members' next-token logits, each (N, V) or (N, 1, V) -> (N, V) float32 log of
    their averaged probabilities: logsumexp_i log_softmax(logits_i) - log N."""
    log_probs = [tf.nn.log_softmax(tf.cast(x[:, -1] if x.shape.rank == 3 else x, tf.float32),
                                   axis=-1) for x in logits]
    return tf.reduce_logsumexp(tf.stack(log_probs), axis=0) - math.log(len(log_probs))


def ensemble_decoder(models, source_ids, beams=1, extra_length=DEFAULTS.extra_length,
                     max_output_length=None, static_cache=False, shortlist=None):
    """Encodes `source_ids` (B, S) with every model of `models` and returns the
    :class:`DecodeStart` of a search over their averaged probabilities.

    cache and context: lists with one entry per member, each that member's
    :func:`transformer_decoder` cache (leaves (B * beams, ...)) and context (leaves (B,
    ...)), so the searches reorder and shrink them as they do one model's. The step
    function returns (N, V) float32 log-probabilities (:func:`ensemble_log_probs`). The
    output limits are those of the smallest position table among the members (and
    `max_output_length`); `shortlist` restricts every member to the same columns. The
    prefill function (a forced prefix in one pass) averages the members' likewise.

    Raises:
        ValueError: fewer than one model, or vocabulary sizes that differ.
    """
    models = members(models)
    cap = check_members(models)
    if max_output_length is not None:
        cap = min(cap, checks.integer(max_output_length, "max_output_length", 1))
    starts = [transformer_decoder(m, source_ids, beams, extra_length, cap, static_cache,
                                  shortlist) for m in models]

    def step_fn(ids, index, cache, context):
        outputs = [start.step_fn(ids, index, c, x)
                   for start, c, x in zip(starts, cache, context, strict=True)]
        return ensemble_log_probs([logits for logits, _ in outputs]), [c for _, c in outputs]

    def prefill_fn(ids, index, cache, context):
        outputs = [start.prefill_fn(ids, index, c, x)
                   for start, c, x in zip(starts, cache, context, strict=True)]
        rows, columns = tf.shape(ids)[0], tf.shape(ids)[1]
        log_probs = ensemble_log_probs([tf.reshape(logits, [rows * columns, -1])
                                        for logits, _ in outputs])  # (B·t, V)
        return (tf.reshape(log_probs, [rows, columns, tf.shape(log_probs)[-1]]),
                [c for _, c in outputs])

    first = starts[0]
    return DecodeStart(step_fn, [s.cache for s in starts], [s.context for s in starts],
                       first.limits, first.output_columns, prefill_fn)
