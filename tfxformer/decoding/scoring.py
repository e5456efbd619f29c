"""Scoring given translations: log P(target | source) by one teacher-forced decode.

As fairseq's `--score-reference` and OpenNMT's `score`: the decoder reads BOS followed by
the target, and each target token (the EOS included) is scored with the model's float32
log-softmax at its position,

    log P(Y | X) = sum_t log softmax(logits_t)[y_t],      t = 1 .. |Y|,

the same log-probabilities greedy and beam search add up while decoding, so the score of
a search's own output is its unnormalized search score. An ensemble (a list of models)
scores with the members' averaged probabilities, as its searches do
(:mod:`tfxformer.decoding.ensemble`): log p(y) = logsumexp_i log p_i(y) - log N.
The length-normalised score is the mean over the target tokens, log P(Y | X) / |Y|.
:func:`next_logits` is the same teacher-forced decode read at one position: the logits of
the token after a given target prefix (a translator's alternatives after a prefix).

Shapes: B pairs, S source length, T target length (EOS included), V vocabulary.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf

from tfxformer.decoding import model_calls
from tfxformer.decoding.chunking import decode_in_chunks
from tfxformer.decoding.ensemble import check_members, ensemble_log_probs, members
from tfxformer.ids import BOS_ID, PAD_ID

__all__ = ["ScoreOutput", "next_logits", "score_ragged", "score_targets"]


class ScoreOutput(NamedTuple):
    """Scores of B pairs: token_log_probs (B, T) float32, 0 after each target's end;
    lengths (B,) int32 target tokens; scores (B,) float32 their sum, log P(Y | X)."""

    token_log_probs: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor


def _token_log_probs(model, source_ids, decoder_inputs, target_ids):
    """(B, T) float32 log softmax(logits)[target] of one model, without materializing the
    (B, T, V) log-softmax: logit[target] - logsumexp(logits)."""
    memory, source_mask = model_calls.encode(model, source_ids)
    logits = tf.cast(model_calls.decode(model, decoder_inputs, memory, source_mask), tf.float32)
    chosen = tf.gather(logits, target_ids, batch_dims=2)  # (B, T)
    return chosen - tf.reduce_logsumexp(logits, axis=-1)


def score_targets(model, source_ids, target_ids, pad_id=PAD_ID, bos_id=BOS_ID):
    """Teacher-forced log-probabilities of `target_ids` given `source_ids`.

    Args:
        model: a :class:`tfxformer.Transformer`, or a list or tuple of them sharing a
            vocabulary (an ensemble: averaged probabilities).
        source_ids: (B, S) int ids, PAD 0, each row ending with EOS (as the searches take).
        target_ids: (B, T) int ids of the targets, each row its tokens then EOS, PAD after
            (the searches' output ids are such rows); T at most the model's positions.
        pad_id, bos_id: padding, and the first decoder input.

    Returns:
        :class:`ScoreOutput`: per-token log-probabilities (B, T) (0 at padding), lengths
        (B,) (non-PAD target tokens) and scores (B,), their sum.

    Example:
    >>> out = score_targets(model, [[5, 6, 3]], [[7, 3]])
    >>> out.scores.shape, out.token_log_probs.shape
    (TensorShape([1]), TensorShape([1, 2]))
    """
    models = members(model)
    check_members(models)
    source_ids = tf.convert_to_tensor(source_ids)
    target_ids = tf.cast(tf.convert_to_tensor(target_ids), tf.int32)
    batch = tf.shape(target_ids)[0]
    decoder_inputs = tf.concat([tf.fill([batch, 1], bos_id), target_ids[:, :-1]], axis=1)
    per_model = [_token_log_probs(m, source_ids, decoder_inputs, target_ids) for m in models]
    token = per_model[0] if len(per_model) == 1 else \
        tf.reduce_logsumexp(tf.stack(per_model), axis=0) - math.log(len(per_model))
    real = target_ids != pad_id
    token = tf.where(real, token, 0.0)
    return ScoreOutput(token, tf.reduce_sum(tf.cast(real, tf.int32), axis=1),
                       tf.reduce_sum(token, axis=1))


def score_ragged(model, source_ids, target_ids, batch_size):
    """:func:`score_targets` of ragged pairs in the graph: (N, None) source and target
    ids (ragged, no padding), scored `batch_size` pairs at a time in order of length
    (:func:`tfxformer.decoding.chunking.decode_in_chunks`: little padding, bounded
    memory); results in input order.

    Returns:
        (token_log_probs (N, None) ragged float32, lengths (N,) int32, scores (N,) float32).
    """
    lengths = tf.cast(target_ids.row_lengths(), tf.int32)
    width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))  # every chunk's columns

    def score(rows, _):
        target = tf.gather(target_ids, rows).to_tensor()
        out = score_targets(model, tf.gather(source_ids, rows).to_tensor(), target)
        padding = [[0, 0], [0, width - tf.shape(out.token_log_probs)[1]]]
        return tf.pad(out.token_log_probs, padding), out.scores

    values, scores = decode_in_chunks(source_ids.row_lengths() + target_ids.row_lengths(),
                                      batch_size, score, (tf.float32, tf.float32),
                                      ranks=(2, 1))
    return tf.RaggedTensor.from_tensor(values, lengths=lengths), lengths, scores


def next_logits(model, source_ids, prefix, lengths):
    """The next-token logits (N, V) float32 after each row's prefix, by one teacher-forced
    decode (the decoder reads BOS and the prefix at once): `source_ids` (N, S), `prefix`
    (N, P) ids (PAD after each), `lengths` (N,) its tokens. An ensemble (a list of models)
    gives its averaged log-probabilities, which play the logits' part (as its step)."""
    models = members(model)
    batch = tf.shape(prefix)[0]
    inputs = tf.concat([tf.fill([batch, 1], BOS_ID), tf.cast(prefix, tf.int32)], axis=1)
    logits = []
    for member in models:
        memory, source_mask = model_calls.encode(member, source_ids)
        out = model_calls.decode(member, inputs, memory, source_mask)  # (N, P + 1, V)
        logits.append(tf.cast(tf.gather(out, lengths, batch_dims=1), tf.float32))
    return logits[0] if len(logits) == 1 else ensemble_log_probs(logits)
