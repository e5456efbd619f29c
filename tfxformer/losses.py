"""Label-smoothed cross-entropy (§5.4), normalised by the real target tokens of the global batch."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.layers.masks import PAD_ID


def label_smoothed_nll(labels, logits, label_smoothing=0.1):
    """Summed label-smoothed negative log-likelihood over the real (non-pad) tokens.

    The target distribution puts 1 - ε on the reference token and ε spread uniformly over
    the whole vocabulary (Szegedy et al., 2016, as cited in §5.4).

    Args:
        labels: (B, T) integer ids, pad id 0 ignored.
        logits: (B, T, V) logits.

    Returns:
        (loss_sum, token_count): float32 scalars over this batch (this replica).
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    nll = -tf.gather(log_probs, labels, batch_dims=2)  # (B, T)
    smooth = -tf.reduce_mean(log_probs, axis=-1)  # (B, T), cross-entropy with the uniform
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return tf.reduce_sum(per_token * mask), tf.reduce_sum(mask)


def global_sum(value):
    """Sum of `value` over all replicas when called inside a replica context, else `value`."""
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, value)
    return value


@keras.saving.register_keras_serializable(package="tfxformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Label-smoothed cross-entropy over real target tokens (§5.4, ε_ls = 0.1).

    "During training, we employed label smoothing of value ε_ls = 0.1. This hurts
    perplexity, as the model learns to be more unsure, but improves accuracy and BLEU."

    Takes integer targets and logits, ignores pad id 0 and returns the mean over real
    target tokens. Under a distribution strategy each replica divides its sum by the
    number of real target tokens in the whole global batch (all replicas), so the summed
    gradients are those of the global mean, whatever the replicas' token counts. This
    relies on Keras (and tfxformer's training loop) summing replica gradients, which
    both do.

    Args:
        label_smoothing: ε_ls (0.1).

    Example:
    >>> loss = LabelSmoothedCrossEntropy(0.0)
    >>> float(loss(tf.constant([[1, 0]]), tf.math.log([[[0.5, 0.5], [0.9, 0.1]]])))
    0.693147...
    """

    def __init__(self, label_smoothing=0.1, name="label_smoothed_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        loss_sum, count = label_smoothed_nll(y_true, y_pred, self.label_smoothing)
        # A scalar is returned as is by Keras' reduction (no per-replica rescaling).
        return loss_sum / tf.maximum(global_sum(count), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing)
        return config
