"""Graph pieces of the `translate_nbest` signature: output a translator can steer.

`translate_nbest` is the signature with every option, one value per text (so TF Serving's
batching can batch it; docs/steering.md): the options of `translate_per_example` plus
`num_hypotheses`, and it returns each text's n-best list, best first. This module holds
its graph helpers; :class:`tfxformer.serving.Translator` calls them.

Shapes: N texts, M texts of one group, B texts of one chunk, K hypotheses per text (the
batch's largest `num_hypotheses`), L output columns.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.decoding.common import NEG_INF

# The per-text inputs of `translate_nbest` after `text` (and a multilingual model's
# `target_language`), in order; each (N,), and the value that turns the option off.
NBEST_SPECS = (tf.TensorSpec([None], tf.int32, name="beam_size"),
               tf.TensorSpec([None], tf.float32, name="alpha"),
               tf.TensorSpec([None], tf.int32, name="extra_length"),
               tf.TensorSpec([None], tf.int32, name="max_input_tokens"),
               tf.TensorSpec([None], tf.int32, name="num_hypotheses"))
NBEST_INPUTS = tuple(spec.name for spec in NBEST_SPECS)


def checked(tensor, condition, message):
    """`tensor`, computed only after the scalar bool `condition` held (InvalidArgument)."""
    with tf.control_dependencies([tf.debugging.Assert(condition, [message])]):
        return tf.identity(tensor)


def per_text(value, size, name, dtype):
    """`value` as an (N,) `dtype` tensor with one value per text, or InvalidArgument."""
    value = tf.cast(value, dtype)
    if value.shape.rank != 0:
        value = checked(value, tf.equal(tf.size(value), size),
                        f"`{name}` must have one value per text (shape [N] like `text`)")
    return tf.broadcast_to(value, [size])


def hypothesis_counts(num_hypotheses, beam_size, size):
    """(N,) int32 `num_hypotheses`, checked: 1 <= num_hypotheses <= beam_size per text."""
    count = per_text(num_hypotheses, size, "num_hypotheses", tf.int32)
    return checked(count, tf.reduce_all((count >= 1) & (count <= beam_size)),
                   "`num_hypotheses` must be >= 1 and <= `beam_size` for every text")


def width(count):
    """K: the largest of the (N,) counts, 1 for an empty batch."""
    return tf.reduce_max(tf.concat([count, [1]], axis=0))


def decode_grouped(keys, lengths, chunk_size, decode, dtypes):
    """Decodes N rows in groups of equal `keys` ((N, G) int32: rows whose decoding options
    are equal), each group sorted by `lengths` (N,) (longest first, little padding) and
    cut into chunks of at most `chunk_size` rows.

    `decode(rows)` gets the (B,) int64 row indices of one chunk and returns a tuple of
    tensors (B, K) of `dtypes`; the result is that tuple for all N rows, in row order.
    """
    order = tf.argsort(lengths, direction="DESCENDING", stable=True)
    unique = tf.raw_ops.UniqueV2(x=tf.gather(keys, order), axis=tf.constant([0], tf.int64))
    groups = tf.shape(unique.y)[0]

    def group_body(g, n, rows_out, arrays):
        members = tf.cast(tf.gather(order, tf.where(tf.equal(unique.idx, g))[:, 0]), tf.int64)
        total = tf.size(members)
        chunks = (total + chunk_size - 1) // chunk_size

        def chunk_body(c, n, rows_out, arrays):
            rows = members[c * chunk_size:tf.minimum((c + 1) * chunk_size, total)]
            outputs = decode(rows)
            arrays = [a.write(n, o) for a, o in zip(arrays, outputs, strict=True)]
            return c + 1, n + 1, rows_out.write(n, rows), arrays

        _, n, rows_out, arrays = tf.while_loop(lambda c, *_: c < chunks, chunk_body,
                                               [tf.constant(0), n, rows_out, arrays])
        return g + 1, n, rows_out, arrays

    rows_out = tf.TensorArray(tf.int64, size=0, dynamic_size=True, infer_shape=False,
                              element_shape=[None])
    arrays = [tf.TensorArray(d, size=0, dynamic_size=True, infer_shape=False,
                             element_shape=[None, None]) for d in dtypes]
    _, n, rows_out, arrays = tf.while_loop(lambda g, *_: g < groups, group_body,
                                           [tf.constant(0), tf.constant(0), rows_out, arrays])
    empty = tf.equal(n, 0)
    rows = tf.cond(empty, lambda: tf.zeros([0], tf.int64), rows_out.concat)
    inverse = tf.math.invert_permutation(rows)
    return tuple(tf.gather(tf.cond(empty, lambda d=d: tf.zeros([0, 0], d), a.concat), inverse)
                 for a, d in zip(arrays, dtypes, strict=True))


def nbest_lists(ids, lengths, scores, count, k, detokenize):
    """A chunk's n-best lists from a beam search: ids (B, beam, L), lengths and scores
    (B, beam), count (B,) the hypotheses each text asked for -> (translations (B, K)
    strings, scores (B, K) float32), "" and -inf beyond a text's count or where the
    search holds no hypothesis (K wider than the beam, or fewer hypotheses found)."""
    batch, beam = tf.shape(ids)[0], tf.shape(ids)[1]
    kept = tf.minimum(beam, k)
    ids, lengths, scores = ids[:, :kept], lengths[:, :kept], scores[:, :kept]
    columns = tf.shape(ids)[2]
    text = tf.reshape(detokenize(tf.reshape(ids, [-1, columns]), tf.reshape(lengths, [-1])),
                      [batch, kept])
    pad = [[0, 0], [0, k - kept]]
    text, scores = tf.pad(text, pad), tf.pad(scores, pad, constant_values=NEG_INF)
    real = (tf.range(k)[None, :] < count[:, None]) & (scores > NEG_INF / 2)
    return (tf.where(real, text, ""),
            tf.where(real, scores, tf.constant(-float("inf"), tf.float32)))


def with_blank_rows(blank, translations, scores, k):
    """(A, K) n-best lists of the A non-blank texts -> (N, K) for all N texts: a blank
    text's list is the empty translation with score 0, then "" / -inf."""
    index = tf.where(blank, tf.shape(translations, out_type=tf.int64)[0],
                     tf.cumsum(tf.cast(~blank, tf.int64)) - 1)
    first = tf.range(k) == 0
    empty_text = tf.fill([1, k], "")
    empty_score = tf.where(first, 0.0, -float("inf"))[None, :]
    translations = tf.concat([tf.reshape(translations, [-1, k]), empty_text], axis=0)
    scores = tf.concat([tf.reshape(scores, [-1, k]), empty_score], axis=0)
    return tf.gather(translations, index), tf.gather(scores, index)
