"""decode_in_chunks (tfxformer.decoding.chunking): rows grouped by their keys, each group
longest first in chunks of at most `chunk_size` rows, outputs back in row order."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer.decoding.chunking import decode_in_chunks

LENGTHS = [3, 7, 1, 7, 5, 2, 9, 4]
KEYS = [[1, 0], [2, 0], [1, 0], [1, 0], [2, 0], [1, 0], [1, 0], [2, 0]]


def _decode(rows, chunk):
    """Each row's own index, its chunk's number and size, and a (B, 2) output."""
    size = tf.fill(tf.shape(rows), tf.size(rows))
    pairs = tf.stack([tf.cast(rows, tf.int32), tf.cast(rows, tf.int32) * 10], axis=1)
    return tf.cast(rows, tf.int32), tf.fill(tf.shape(rows), chunk), size, pairs


def _chunks(lengths, chunk_size, keys=None, compiled=False):
    def run(lengths, keys):
        return decode_in_chunks(lengths, chunk_size, _decode,
                                (tf.int32, tf.int32, tf.int32, tf.int32), (1, 1, 1, 2), keys)

    if compiled:
        run = tf.function(run, autograph=False)
    keys = None if keys is None else tf.constant(keys, tf.int32)
    return [t.numpy() for t in run(tf.constant(lengths, tf.int32), keys)]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("keys", [None, KEYS])
def test_rows_come_back_in_order_from_length_sorted_chunks_of_equal_keys(keys, compiled):
    rows, chunk, size, pairs = _chunks(LENGTHS, 2, keys, compiled)
    np.testing.assert_array_equal(rows, np.arange(len(LENGTHS)))
    np.testing.assert_array_equal(pairs, np.stack([rows, rows * 10], axis=1))
    assert size.max() <= 2
    group = [0] * len(LENGTHS) if keys is None else [k[0] for k in keys]
    for c in set(chunk):
        members = np.flatnonzero(chunk == c)
        assert len(members) == size[members[0]]
        assert len({group[m] for m in members}) == 1  # one group per chunk
    for a in range(len(LENGTHS)):  # within a group, a longer row is never in a later chunk
        for b in range(len(LENGTHS)):
            if group[a] == group[b] and LENGTHS[a] > LENGTHS[b]:
                assert chunk[a] <= chunk[b]


def test_equal_lengths_keep_row_order_and_chunks_fill_up():
    rows, chunk, size, _ = _chunks([4, 4, 4, 4, 4], 2)
    np.testing.assert_array_equal(chunk, [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(size, [2, 2, 2, 2, 1])


@pytest.mark.parametrize("keys", [None, np.zeros([0, 2], np.int32)])
def test_no_rows_give_empty_outputs(keys):
    rows, chunk, size, pairs = _chunks(np.zeros([0], np.int32), 3, keys)
    assert rows.shape == chunk.shape == size.shape == (0,) and pairs.shape == (0, 0)
