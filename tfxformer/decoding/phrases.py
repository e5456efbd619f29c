"""Where a hypothesis stands against flattened phrases (terminology constraints, phrases
to avoid): which token would complete an occurrence of a phrase, and the bans that keep a
constraint phrase to as many occurrences as it is given.

Phrases are held flattened per sentence (:class:`tfxformer.decoding.steering.Steering`):
(B', T) tokens, PAD after, and `continues` (B', T) True where token t is followed by
token t + 1 of the same phrase. A phrase given twice for a sentence is two phrases with
the same tokens, "twins": :func:`twins` pairs their last columns.

Shapes: B' sentences, K hypotheses of each (or N rows), L written columns, T phrase
tokens, V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.ids import PAD_ID

__all__ = ["Layout", "completions", "layout", "scatter_tokens", "token_set", "twins"]


class Layout(NamedTuple):
    """Each column's place in its phrase (all (B', T))."""

    valid: tf.Tensor  # bool: a phrase token (not PAD)
    starts: tf.Tensor  # bool: a phrase's first token
    ends: tf.Tensor  # bool: a phrase's last token
    first: tf.Tensor  # int32: the column of its phrase's first token
    last: tf.Tensor  # int32: the column of its phrase's last token (T - 1 past them)


def layout(tokens, continues) -> Layout:
    """The :class:`Layout` of phrases `tokens` (B', T) with their `continues` flags."""
    valid = tf.not_equal(tokens, PAD_ID)
    continues = continues & valid
    after = tf.pad(continues, [[0, 0], [1, 0]])[:, :-1]  # token t - 1 continues into t
    starts = valid & ~after
    ends = valid & ~continues
    columns = tf.shape(tokens)[1]
    index = tf.range(columns)
    behind = index[None, :] <= index[:, None]  # [t, u]: u <= t
    ahead = index[None, :] >= index[:, None]  # [t, u]: u >= t
    first = tf.reduce_max(tf.where(starts[:, None, :] & behind[None], index, 0), axis=-1)
    last = tf.reduce_min(tf.where(ends[:, None, :] & ahead[None], index, columns - 1),
                         axis=-1)
    return Layout(valid, starts, ends, first, last)


def twins(tokens, places: Layout):
    """(B', T, T) bool: [t, t'] both are a phrase's last column and the two phrases have
    the same tokens (t = t' included)."""
    size = places.last - places.first + 1  # (B', T) the phrase's length, at its last column
    same = (places.ends[:, :, None] & places.ends[:, None, :]
            & tf.equal(size[:, :, None], size[:, None, :]))
    index = tf.range(tf.shape(tokens)[1])

    def body(d, same):
        at = tf.gather(tokens, tf.maximum(index - d, 0), axis=1)  # (B', T) d before
        agree = tf.equal(at[:, :, None], at[:, None, :]) | (d >= size)[:, :, None]
        return d + 1, same & agree

    longest = tf.reduce_max(tf.concat([tf.reshape(size, [-1]), [1]], axis=0))
    _, same = tf.while_loop(lambda d, _: d < longest, body, [tf.constant(0), same])
    return same


def completions(history, length, tokens, places: Layout):
    """(B', K, T) bool: writing token t next completes an occurrence of its phrase (t is
    the phrase's last column and the last `n - 1` of the `length` () int32 tokens of
    `history` (B', K, L) are its first n - 1; always, for a one-token phrase)."""
    columns = tf.shape(history)[2]
    before = places.last - tf.range(tf.shape(tokens)[1])[None, :]  # (B', T) tokens after u
    at = length - before  # the history column token u must be at
    shape = tf.shape(history)[:2]
    index = tf.broadcast_to(tf.clip_by_value(at, 0, columns - 1)[:, None, :],
                            tf.concat([shape, tf.shape(tokens)[1:]], axis=0))
    written = tf.gather(history, index, batch_dims=2)  # (B', K, T)
    inner = (places.valid & ~places.ends)[:, None, :]
    bad = inner & ((at < 0)[:, None, :] | tf.not_equal(written, tokens[:, None, :]))
    count = tf.cumsum(tf.cast(bad, tf.int32), axis=-1, exclusive=True)  # bad ones before u
    from_first = tf.gather(count, tf.broadcast_to(places.first[:, None, :], tf.shape(count)),
                           batch_dims=2)
    return places.ends[:, None, :] & tf.equal(count, from_first)


def scatter_tokens(mask, tokens, vocab):
    """(B'·K, V) bool: the tokens (B', T) of `mask` (B', K, T) True, per row b·K + k."""
    shape = tf.shape(mask)
    rows = shape[0] * shape[1]
    return token_set(tf.reshape(tf.broadcast_to(tokens[:, None, :], shape), [rows, shape[2]]),
                     tf.reshape(mask, [rows, shape[2]]), vocab)


def token_set(tokens, mask, vocab):
    """(N, V) bool: per row, the tokens (N, C) int32 (valid ids, also where masked out)
    where `mask` (N, C) is True."""
    row = tf.broadcast_to(tf.range(tf.shape(tokens)[0])[:, None], tf.shape(tokens))
    counts = tf.scatter_nd(tf.stack([row, tokens], axis=-1), tf.cast(mask, tf.int32),
                           tf.stack([tf.shape(tokens)[0], vocab]))
    return counts > 0
