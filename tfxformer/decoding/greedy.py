"""Greedy incremental decoding with the decoder's key/value cache (the test reference).

Shared pieces of both decoders live here too: the fixed token ids, the per-sentence
length limits (§6.1: "maximum output length to input length + 50") and the float32
next-token log-probabilities.

Shapes: B batch, S source length, L longest output (cache length), V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401 (re-exported)

# Score of impossible hypotheses: finite, so sums and comparisons never give NaN.
NEG_INF = -1e9
DEFAULT_EXTRA_LENGTH = 50


class DecodeOutput(NamedTuple):
    """Greedy result: ids (B, L) int32 ending with EOS then PAD; lengths (B,) tokens
    including the EOS; scores (B,) float32 sums of token log-probabilities."""

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor


def checked(tensor, assertion, message):
    """`tensor`, computed only after `assertion(tensor)` passed (ops in a graph need not
    run in program order otherwise)."""
    with tf.control_dependencies([assertion(tensor, message=message)]):
        return tf.identity(tensor)


def check_nonnegative_int(value, name):
    """Raises ValueError for a Python value that is not an int >= 0; a tensor gets a
    graph assertion."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return checked(value, tf.debugging.assert_non_negative, f"`{name}` must be >= 0")
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}.")
    return int(value)


def position_cap(model, max_length=None):
    """Largest number of decoder positions: the model's `max_positions`, or less if asked."""
    cap = int(model.model_config["max_positions"])
    if max_length is not None:
        if int(max_length) < 1:
            raise ValueError(f"`max_length` must be a positive integer, got {max_length!r}.")
        cap = min(cap, int(max_length))
    return cap


def decode_limits(model, source_ids, source_mask, extra_length, max_length=None):
    """Per-sentence output length limits (B,) and the cache length L (a scalar).

    limit_b = min(source_length_b + extra_length, max positions), counting the EOS
    (§6.1). L = min(S + extra_length, max positions) depends only on the padded shape,
    so it is a compile-time constant under XLA; every limit_b <= L.
    """
    extra = check_nonnegative_int(extra_length, "extra_length")
    extra = tf.cast(extra, tf.int32)
    cap = position_cap(model, max_length)
    source_lengths = tf.reduce_sum(tf.cast(source_mask, tf.int32), axis=1)  # (B,)
    limits = tf.clip_by_value(source_lengths + extra, 1, cap)
    cache_length = tf.clip_by_value(tf.shape(source_ids)[1] + extra, 1, cap)
    return limits, cache_length


def next_token_log_probs(logits):
    """(N, V) logits -> float32 log-probabilities; PAD and BOS are never generated."""
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    vocab = tf.shape(log_probs)[-1]
    forbidden = tf.reduce_any(tf.range(vocab)[:, None] == [[PAD_ID, BOS_ID]], axis=-1)
    return tf.where(forbidden[None, :], NEG_INF, log_probs)


def write_column(ids, column, values):
    """ids (..., L) with ids[..., column] = values (...); XLA-friendly (no scatter)."""
    at = tf.range(tf.shape(ids)[-1]) == column
    return tf.where(at, values[..., None], ids)


def cache_invariants(cache, static_cache):
    """`tf.while_loop` shape invariants of a decoder cache: a growing cache (B, H, i, K)
    changes length along axis 2 every step; a static one keeps its shapes."""
    def invariant(t):
        if static_cache or t.shape.rank != 4:
            return t.shape
        return tf.TensorShape([t.shape[0], t.shape[1], None, t.shape[3]])
    return tf.nest.map_structure(invariant, cache)


def greedy_decode(model, source_ids, extra_length=DEFAULT_EXTRA_LENGTH, max_length=None,
                  static_cache=False):
    """Greedy decoding: the most probable token at every step, with the key/value cache.

    One `model.decode_step` per token inside a `tf.while_loop` (graph-safe and
    XLA-compatible; wrap in `tf.function(jit_compile=True)` to compile). The decoder
    starts from BOS; a sentence stops at EOS or at its length limit (source length
    + `extra_length`, at most the model's `max_length` positions, §6.1); the loop stops
    when every sentence has. Equal to beam search with beam 1 and α = 0.

    Args:
        model: a :class:`tfxformer.Transformer` (or any object with `encode`,
            `init_cache`, `decode_step` and `model_config["max_length"]`).
        source_ids: (B, S) int ids, PAD 0, each row ending with EOS.
        extra_length: output tokens allowed beyond the source length (default 50).
        max_length: optional lower cap on output tokens than the model's positions.
        static_cache: keep the self-attention cache at its full length L and write each
            step into its slot (needed under XLA, `jit_compile=True`); by default the
            cache grows by one position per step, so step i costs i positions, not L.

    Returns:
        :class:`DecodeOutput` with ids (B, L), lengths (B,), scores (B,).
    """
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_mask = model.encode(source_ids)
    limits, length = decode_limits(model, source_ids, source_mask, extra_length, max_length)
    batch = tf.shape(source_ids)[0]

    def body(i, tokens, finished, scores, ids, cache):
        logits, cache = model.decode_step(tokens[:, None], source_mask, cache, i,
                                          append_cache=not static_cache)
        log_probs = next_token_log_probs(logits[:, -1])  # (B, V)
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        token_log_prob = tf.gather(log_probs, token, batch_dims=1)
        token = tf.where(finished, PAD_ID, token)
        scores = scores + tf.where(finished, 0.0, token_log_prob)
        ids = write_column(ids, i, token)
        finished = finished | tf.equal(token, EOS_ID) | (i + 1 >= limits)
        return i + 1, token, finished, scores, ids, cache

    def cond(i, tokens, finished, scores, ids, cache):
        return (i < length) & ~tf.reduce_all(finished)

    state = (tf.constant(0), tf.fill([batch], BOS_ID), tf.zeros([batch], tf.bool),
             tf.zeros([batch], tf.float32), tf.zeros([batch, length], tf.int32),
             model.init_cache(memory, length if static_cache else None))
    invariants = tuple(t.shape for t in state[:-1]) + (
        cache_invariants(state[-1], static_cache),)
    _, _, _, scores, ids, _ = tf.while_loop(cond, body, state, shape_invariants=invariants)
    lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
    return DecodeOutput(ids, lengths, scores)
