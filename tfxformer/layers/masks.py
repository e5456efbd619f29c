"""Attention masks (§3.2.3). One convention everywhere: bool, True = may attend.

Shapes: B batch, S source length, T target (query) length.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.ids import PAD_ID


def padding_mask(ids: tf.Tensor, pad_id: int = PAD_ID) -> tf.Tensor:
    """(B, S) integer ids -> (B, S) bool, True where the token is real (not `pad_id`)."""
    return tf.not_equal(ids, tf.cast(pad_id, ids.dtype))


def causal_mask(length, offset=0) -> tf.Tensor:
    """(T, T + offset) bool, True where query i may attend key j, i.e. j <= i + offset.

    §3.2.3: "We need to prevent leftward information flow in the decoder to preserve the
    auto-regressive property." `offset` is the number of keys that precede the queries
    (the cache length during incremental decoding).
    """
    rows = tf.range(length)[:, None] + offset
    cols = tf.range(length + offset)[None, :]
    return cols <= rows

