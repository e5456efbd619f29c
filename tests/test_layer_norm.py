"""tfxformer.layers.norm.LayerNorm: Keras' LayerNormalization with a cheaper graph, same
numbers, variables and config."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfxformer.layers.norm import LayerNorm


def _pair(shape, epsilon=1e-6, dtype=None):
    ours = LayerNorm(epsilon=epsilon, dtype=dtype)
    theirs = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype)
    ours.build(shape)
    theirs.build(shape)
    rng = np.random.default_rng(0)
    for layer in (ours, theirs):
        layer.gamma.assign(rng.normal(size=shape[-1:]).astype("float32"))
        layer.beta.assign(rng.normal(size=shape[-1:]).astype("float32"))
        rng = np.random.default_rng(0)
    return ours, theirs


@pytest.mark.parametrize("shape", [(4, 1, 16), (3, 5, 8), (6, 32)])
def test_equals_keras_forward_and_backward(shape):
    ours, theirs = _pair(shape)
    x = tf.random.normal(shape, seed=1) * 3.0 + 1.5
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        a, b = ours(x), theirs(x)
        la, lb = tf.reduce_sum(a * a), tf.reduce_sum(b * b)
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    for ga, gb in zip(tape.gradient(la, [x, *ours.trainable_weights]),
                      tape.gradient(lb, [x, *theirs.trainable_weights]), strict=True):
        np.testing.assert_allclose(ga, gb, atol=1e-4, rtol=1e-4)


def test_mixed_precision_computes_in_float32_and_returns_compute_dtype():
    ours, theirs = _pair((2, 3, 8), dtype="mixed_bfloat16")
    x = tf.cast(tf.random.normal((2, 3, 8), seed=2), tf.bfloat16)
    a, b = ours(x), theirs(x)
    assert a.dtype == b.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(a, tf.float32), tf.cast(b, tf.float32), atol=2e-2)


def test_same_variables_and_config_as_keras():
    ours, theirs = _pair((2, 8))
    assert [v.path.split("/")[-1] for v in ours.weights] == \
        [v.path.split("/")[-1] for v in theirs.weights] == ["gamma", "beta"]
    config = ours.get_config()
    assert {k: v for k, v in config.items() if k != "name"} == \
        {k: v for k, v in theirs.get_config().items() if k != "name"}
    clone = LayerNorm.from_config(config)
    clone.build((2, 8))
    clone.set_weights(ours.get_weights())
    x = tf.random.normal((2, 8))
    np.testing.assert_array_equal(clone(x), ours(x))


def test_other_settings_use_keras_call():
    x = tf.random.normal((2, 3, 4), seed=3)
    ours = LayerNorm(axis=[1, 2], epsilon=1e-3)
    theirs = keras.layers.LayerNormalization(axis=[1, 2], epsilon=1e-3)
    np.testing.assert_allclose(ours(x), theirs(x), atol=1e-6)
    ours, theirs = LayerNorm(center=False), keras.layers.LayerNormalization(center=False)
    np.testing.assert_allclose(ours(x), theirs(x), atol=1e-6)
