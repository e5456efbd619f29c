"""tfxformer.decoding.topk: the chunked top-k gives tf.math.top_k's values and indices."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer.decoding.common import NEG_INF
from tfxformer.decoding.topk import top_k


def _same_as_topk(x, k, **kwargs):
    want = tf.math.top_k(x, k)
    values, indices = top_k(x, k, **kwargs)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    assert indices.dtype == tf.int32


@pytest.mark.parametrize("n", [32000, 8000, 5000, 4099])  # multiples of 64 and not
def test_matches_top_k_on_random_rows(n):
    x = np.random.default_rng(n).standard_normal((6, n)).astype(np.float32)
    _same_as_topk(tf.constant(x), 8)


def test_ties_go_to_the_lower_index_as_in_top_k():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(16, 4096)).astype(np.float32)  # thousands of equal values
    _same_as_topk(tf.constant(x), 8)
    x = np.zeros((3, 4096), np.float32)  # every value equal
    x[1, [7, 4000, 4001]] = 1.0  # three above the rest, in two chunks
    _same_as_topk(tf.constant(x), 8)


def test_ties_between_chunk_maxima_at_the_threshold():
    x = np.full((2, 64 * 40), -5.0, np.float32)
    x[:, 64 * np.arange(40) + 63] = 1.0  # every chunk's maximum equal, at its last slot
    x[0, 64 * 30] = 2.0
    _same_as_topk(tf.constant(x), 8)


def test_impossible_candidates_and_infinities():
    x = np.random.default_rng(1).standard_normal((4, 8000)).astype(np.float32)
    x[0, :7990] = NEG_INF  # fewer real values than chunks
    x[1] = NEG_INF
    x[2, ::3] = -np.inf
    _same_as_topk(tf.constant(x), 8)


def test_short_rows_and_dynamic_lengths():
    x = np.random.default_rng(2).standard_normal((3, 1000)).astype(np.float32)
    _same_as_topk(tf.constant(x), 8)  # short: tf.math.top_k itself
    fn = tf.function(lambda t: top_k(t, 8),
                     input_signature=[tf.TensorSpec([None, None], tf.float32)])
    for n in (100, 2048, 4099, 9000):
        x = np.random.default_rng(n).standard_normal((5, n)).astype(np.float32)
        want = tf.math.top_k(x, 8)
        values, indices = fn(tf.constant(x))
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


def test_a_traced_k():
    fn = tf.function(lambda t, k: top_k(t, k),
                     input_signature=[tf.TensorSpec([None, 8000], tf.float32),
                                      tf.TensorSpec([], tf.int32)])
    x = np.random.default_rng(4).standard_normal((3, 8000)).astype(np.float32)
    for k in (2, 8, 40):  # 40: too few chunks per k, tf.math.top_k's branch
        values, indices = fn(tf.constant(x), tf.constant(k))
        np.testing.assert_array_equal(indices.numpy(), tf.math.top_k(x, k).indices.numpy())


def test_compiles_with_xla_and_other_chunk_sizes():
    x = tf.constant(np.random.default_rng(3).standard_normal((4, 8000)).astype(np.float32))
    values, indices = tf.function(lambda t: top_k(t, 8), jit_compile=True)(x)
    np.testing.assert_array_equal(indices.numpy(), tf.math.top_k(x, 8).indices.numpy())
    for chunk in (1, 16, 100):
        _same_as_topk(x, 5, chunk=chunk)


def test_clear_errors():
    with pytest.raises(ValueError, match="rows, n"):
        top_k(tf.zeros([2, 3, 4000]), 2)
    with pytest.raises(ValueError, match="k"):
        top_k(tf.zeros([2, 4000]), 0)
