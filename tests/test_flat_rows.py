"""tfxformer.serving.flat_rows against the tf.ragged constructs it replaces: the same
values on rows that are empty, first, last, long and unicode, in eager and in a graph, in a
fraction of the graph nodes."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer.serving import flat_rows

SPLITS = [[0], [0, 0], [0, 3], [0, 0, 2, 2, 5, 5], [0, 1, 1, 1, 4]]
TEXTS = ["", "one", "  two  words ", "tab\tand\nnewline", "nbsp\u00a0stays one word",
         "ideographic\u3000space", "é ü 日本 語", "\u200b", " \t\n "]


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_row_ids_are_value_rowids(splits, dtype):
    splits = tf.constant(splits, dtype)
    ragged = tf.RaggedTensor.from_row_splits(tf.range(splits[-1]), splits)
    ids = flat_rows.row_ids(splits)
    assert ids.dtype == dtype
    np.testing.assert_array_equal(ids, ragged.value_rowids())


@pytest.mark.parametrize("splits", SPLITS)
def test_join_rows_is_reduce_join_of_the_ragged_rows(splits):
    splits = tf.constant(splits, tf.int64)
    values = tf.strings.as_string(tf.range(splits[-1])) + "é"
    rows = flat_rows.row_ids(splits)
    expected = tf.strings.reduce_join(tf.RaggedTensor.from_value_rowids(
        values, rows, nrows=tf.size(splits, tf.int64) - 1), axis=1, separator="; ")
    got = flat_rows.join_rows(values, rows, tf.size(splits) - 1, separator="; ")
    assert got.numpy().tolist() == expected.numpy().tolist()


def test_repeat_splits_and_masked_are_tf_repeat_and_boolean_mask():
    values = tf.constant([[1, 2], [3, 4], [5, 6], [7, 8]])
    for counts in ([0, 0, 0, 0], [1, 0, 3, 2], [2, 2, 2, 2]):
        np.testing.assert_array_equal(flat_rows.repeat(values, tf.constant(counts)),
                                      tf.repeat(values, counts, axis=0))
        np.testing.assert_array_equal(flat_rows.splits_of(tf.constant(counts)),
                                      tf.RaggedTensor.from_row_lengths(
                                          tf.zeros([sum(counts)]), counts).row_splits)
    for mask in ([False] * 4, [True, False, True, True], [True] * 4):
        np.testing.assert_array_equal(flat_rows.masked(values, tf.constant(mask)),
                                      tf.boolean_mask(values, mask))


def test_word_counts_are_the_rows_of_strings_split():
    np.testing.assert_array_equal(flat_rows.word_counts(tf.constant(TEXTS)),
                                  tf.strings.split(tf.constant(TEXTS)).row_lengths())
    assert flat_rows.word_counts(tf.constant([], tf.string)).shape == [0]


def test_each_is_a_few_graph_nodes_and_the_same_in_a_graph():
    def nodes(fn, *specs):
        graph = tf.function(fn, autograph=False).get_concrete_function(*specs).graph
        return len(graph.as_graph_def().node)

    splits = tf.TensorSpec([None], tf.int64)
    strings = tf.TensorSpec([None], tf.string)
    lean = nodes(lambda s, v: flat_rows.join_rows(v, flat_rows.row_ids(s), tf.size(s) - 1),
                 splits, strings)
    ragged = nodes(lambda s, v: tf.strings.reduce_join(
        tf.RaggedTensor.from_row_splits(v, s), axis=1), splits, strings)
    assert lean * 4 < ragged, (lean, ragged)
    graph_ids = tf.function(flat_rows.row_ids)(tf.constant(SPLITS[3], tf.int64))
    np.testing.assert_array_equal(graph_ids, [1, 1, 3, 3, 3])


def test_regex_pieces_are_regex_splits_values_and_row_splits():
    import tensorflow_text as tf_text

    from tfxformer.serving.segment import SPACE, regex_pieces

    for delimiter, kept in ((SPACE + "+", SPACE + "+"), (r"\.", ""), (r"[A-Z]", r"[A-Z]")):
        pieces, splits = regex_pieces(tf.constant(TEXTS), delimiter, kept)
        expected = tf_text.regex_split(tf.constant(TEXTS), delimiter, kept)
        assert pieces.numpy().tolist() == expected.flat_values.numpy().tolist()
        np.testing.assert_array_equal(splits, expected.row_splits)
