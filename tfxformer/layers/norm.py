"""Layer normalization (§3.1, "LayerNorm(x + Sublayer(x))") with fewer, cheaper ops.

:class:`LayerNorm` is `keras.layers.LayerNormalization` (same variables `gamma` and
`beta`, same config, so checkpoints and `.keras` files are interchangeable) whose forward
pass over the last axis is written as mean -> centre -> mean of squares of the centred
values -> rsqrt, instead of Keras' `moments` (a `SquaredDifference` against the broadcast
mean) followed by folding gamma into the scale: layer normalization was 12 % of a
beam-search call of the shipped Multi30k model, and the two graphs were timed against
each other by a study (bench/STUDIES.md, "Where the time goes"; `git show
677cc7a:bench/studies/microbench.py`, `--cases layer_norm`). The
results agree with Keras' to float32
rounding (tests/test_layer_norm.py). Like Keras, it
computes in float32 under mixed precision and returns the compute dtype.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfxformer")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis, computed as
    (x - mean) * rsqrt(mean((x - mean)^2) + epsilon) * gamma + beta.

    Other settings (several axes, `rms_scaling`, no `center`/`scale`) use Keras' own call.

    Example:
    >>> norm = LayerNorm(epsilon=1e-6)
    >>> norm(tf.constant([[1.0, 2.0, 3.0]])).shape
    TensorShape([1, 3])
    """

    def _fast_path(self, inputs):
        axis = self.axis if isinstance(self.axis, int) else (
            self.axis[0] if len(self.axis) == 1 else None)
        return (axis is not None and axis in (-1, len(inputs.shape) - 1) and self.center
                and self.scale and not self.rms_scaling)

    def call(self, inputs):
        if not self._fast_path(inputs):
            return super().call(inputs)
        return layer_norm(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype)


def layer_norm(inputs, gamma, beta, epsilon, dtype):
    """:class:`LayerNorm`'s forward pass over the last axis, in float32 (float64 stays),
    returned in `dtype`; also what the search step calls with its weights read once
    (:mod:`tfxformer.models.search_step`)."""
    x = tf.cast(inputs, tf.float32) if inputs.dtype != tf.float64 else inputs
    centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True)
    out = centred * tf.math.rsqrt(variance + epsilon) * tf.cast(gamma, x.dtype) + tf.cast(
        beta, x.dtype)
    return tf.cast(out, dtype)
