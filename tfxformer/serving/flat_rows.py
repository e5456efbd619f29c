"""Rows of flat values (a RaggedTensor's parts) in a few graph ops each.

The texts of a request become rows of sentences, words, pieces and alignment pairs, and
back: every signature reads and writes them so. `tf.RaggedTensor`'s generic machinery is
costly in a graph: `from_value_rowids` builds ~150 nodes (most of them validating the
partition), `from_row_splits` ~100, `value_rowids()` ~75, `tf.strings.reduce_join` over a
ragged row ~80, `tf.repeat` ~55, `tf.boolean_mask` ~30. They were a quarter of an export's
graph, which its tracing, loading, warm-up and memory pay for, and a request runs them.

The functions here give the same values from partitions this package builds itself (valid by
construction, so nothing to validate) with the ops that do the work: a row's values joined by
`UnsortedSegmentJoin`, the row of each value by one `UpperBound` over the row splits.
tests/test_flat_rows.py pins each to the `tf.ragged` original.

Shapes: R rows, V values; splits (R + 1,), row ids (V,), non-decreasing.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.decoding.common import masked  # (V, ...) values where a (V,) mask is True

__all__ = ["join_rows", "masked", "repeat", "repeat_each", "row_ids", "splits_of", "word_counts"]


def row_ids(splits):
    """(R + 1,) row splits -> (V,) the row of each value, in the splits' dtype
    (`RaggedTensor.value_rowids()`)."""
    splits = tf.convert_to_tensor(splits)
    values = tf.range(splits[-1])
    return tf.raw_ops.UpperBound(sorted_inputs=splits[None, 1:], values=values[None],
                                 out_type=splits.dtype)[0]


def splits_of(lengths):
    """(R,) row lengths -> (R + 1,) row splits, in the lengths' dtype."""
    lengths = tf.convert_to_tensor(lengths)
    return tf.concat([tf.zeros([1], lengths.dtype), tf.cumsum(lengths)], 0)


def repeat(values, counts):
    """(R, ...) values, (R,) counts -> each row `counts` times, in order (`tf.repeat` on
    axis 0)."""
    return tf.gather(values, row_ids(splits_of(counts)))


def repeat_each(values, times):
    """(R,) values, a scalar -> each value `times` times in a row (`tf.repeat(values,
    times)`)."""
    values = tf.convert_to_tensor(values)
    return tf.reshape(tf.tile(values[:, None], tf.stack([1, times])), [-1])


def join_rows(values, rows, nrows, separator=""):
    """(V,) strings, (V,) non-decreasing row ids, a row count -> (nrows,) each row's
    values joined with `separator`, in order; "" for a row without values
    (`tf.strings.reduce_join` of `tf.RaggedTensor.from_value_rowids(values, rows, nrows)`
    on axis 1)."""
    return tf.strings.unsorted_segment_join(values, rows, nrows, separator=separator)


def word_counts(texts):
    """(N,) strings -> (N,) int32: the whitespace-separated words of each
    (`tf.strings.split(texts).row_lengths()`)."""
    texts = tf.convert_to_tensor(texts, tf.string)
    rows = tf.raw_ops.StringSplitV2(input=texts, sep="").indices[:, 0]
    return tf.math.unsorted_segment_sum(tf.ones_like(rows, tf.int32), rows, tf.size(texts))
