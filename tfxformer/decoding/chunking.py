"""Decoding many rows a chunk at a time: rows grouped by their options, each group sorted
by length and cut into chunks, the results put back in row order.

Every signature of a translator and :func:`tfxformer.decoding.scoring.score_ragged` run
their rows through :func:`decode_in_chunks`: a chunk's rows share their decoding options
(beam size, α, extra length: one search per chunk) and have similar lengths (little
padding), and at most `chunk_size` of them are decoded at once (bounded memory). It is one
`tf.while_loop` over the chunks (two, over the groups and their chunks, with `keys`).

Shapes: N rows, B rows of one chunk, G key columns.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["decode_in_chunks"]


def decode_in_chunks(lengths, chunk_size, decode, dtypes, ranks=None, keys=None):
    """Decodes N rows in chunks of at most `chunk_size` rows, longest first.

    Args:
        lengths: (N,) each row's length; rows are sorted by it, longest first (a stable
            sort: rows of equal length stay in row order).
        chunk_size: the most rows of one chunk (a Python int or () int32).
        decode: `decode(rows, chunk)` gets the (B,) int64 indices of one chunk's rows and
            the chunk's () int32 number (0, 1, ... in the order chunks are decoded) and
            returns a tuple of tensors of `dtypes`, each with B rows.
        dtypes: the dtypes of `decode`'s outputs.
        ranks: their ranks (None: 1 each); every axis after the first has one size in
            all chunks.
        keys: None (one group: all rows), or (N, G) int32, rows of equal keys decoding
            alike (e.g. their beam size, α and extra length): each group's rows are
            decoded in chunks of their own.

    Returns:
        `decode`'s outputs for all N rows, in row order (zero rows for N = 0).
    """
    ranks = ranks or [1] * len(dtypes)
    order = tf.cast(tf.argsort(lengths, direction="DESCENDING", stable=True), tf.int64)

    def chunk_loop(members, n, rows_out, arrays):
        """Decodes the rows `members` (in order) chunk by chunk; `n` chunks done so far."""
        total = tf.size(members)
        chunks = (total + chunk_size - 1) // chunk_size

        def body(c, n, rows_out, arrays):
            rows = members[c * chunk_size:tf.minimum((c + 1) * chunk_size, total)]
            outputs = decode(rows, n)
            arrays = [a.write(n, o) for a, o in zip(arrays, outputs, strict=True)]
            return c + 1, n + 1, rows_out.write(n, rows), arrays

        _, n, rows_out, arrays = tf.while_loop(lambda c, *_: c < chunks, body,
                                               [tf.constant(0), n, rows_out, arrays])
        return n, rows_out, arrays

    rows_out = tf.TensorArray(tf.int64, size=0, dynamic_size=True, infer_shape=False,
                              element_shape=[None])
    arrays = [tf.TensorArray(d, size=0, dynamic_size=True, infer_shape=False,
                             element_shape=[None] * r) for d, r in zip(dtypes, ranks,
                                                                        strict=True)]
    if keys is None:
        n, rows_out, arrays = chunk_loop(order, tf.constant(0), rows_out, arrays)
    else:
        unique = tf.raw_ops.UniqueV2(x=tf.gather(keys, order), axis=tf.constant([0], tf.int64))
        groups = tf.shape(unique.y)[0]

        def group_body(g, n, rows_out, arrays):
            members = tf.gather(order, tf.where(tf.equal(unique.idx, g))[:, 0])
            return (g + 1, *chunk_loop(members, n, rows_out, arrays))

        _, n, rows_out, arrays = tf.while_loop(
            lambda g, *_: g < groups, group_body,
            [tf.constant(0), tf.constant(0), rows_out, arrays])
    empty = tf.equal(n, 0)
    rows = tf.cond(empty, lambda: tf.zeros([0], tf.int64), rows_out.concat)
    inverse = tf.math.invert_permutation(rows)
    return tuple(tf.gather(tf.cond(empty, lambda d=d, r=r: tf.zeros([0] * r, d), a.concat),
                           inverse) for a, d, r in zip(arrays, dtypes, ranks, strict=True))
