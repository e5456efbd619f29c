"""Masked token accuracy: the share of real (non-pad) target tokens predicted exactly."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.ids import PAD_ID
from tfxformer.losses import token_weights


@keras.saving.register_keras_serializable(package="tfxformer")
class MaskedTokenAccuracy(keras.metrics.Metric):
    """argmax(logits) == label over tokens whose label is not the pad id 0.

    Counts (not per-batch means) are accumulated, so the result is exact over an epoch
    and across replicas. With `sample_weight` (per example (B,) or per token (B, T), e.g.
    as a `weighted_metrics` entry of `compile`) the counts are weighted.

    Example:
    >>> m = MaskedTokenAccuracy()
    >>> m.update_state(tf.constant([[1, 2, 0]]), tf.one_hot([[1, 3, 3]], 4))
    >>> float(m.result())
    0.5
    """

    def __init__(self, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = tf.cast(y_true, tf.int32)
        predictions = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
        mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
        if sample_weight is not None:  # per example (B,) or per token (B, T)
            mask *= token_weights(sample_weight, mask)
        hits = tf.cast(tf.equal(labels, predictions), tf.float32) * mask
        self.correct.assign_add(tf.reduce_sum(hits))
        self.total.assign_add(tf.reduce_sum(mask))

    def result(self):
        return tf.math.divide_no_nan(self.correct, self.total)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)
