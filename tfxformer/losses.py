"""Label-smoothed cross-entropy (§5.4), normalised by the real target tokens of the global batch."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.ids import PAD_ID


def label_smoothed_per_token(labels, logits, label_smoothing=0.1):
    """Per-token label-smoothed negative log-likelihood, (B, T) float32, 0 at pad tokens.

    The target distribution puts 1 - ε on the reference token and ε spread uniformly over
    the whole vocabulary (Szegedy et al., 2016, as cited in §5.4).

    Args:
        labels: (B, T) integer ids, pad id 0 ignored.
        logits: (B, T, V) logits.

    Returns:
        (per_token, mask): (B, T) float32 losses (0 where the label is the pad id) and the
        (B, T) float32 mask of real target tokens.
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    nll = -tf.gather(log_probs, labels, batch_dims=2)  # (B, T)
    smooth = -tf.reduce_mean(log_probs, axis=-1)  # (B, T), cross-entropy with the uniform
    mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return ((1.0 - label_smoothing) * nll + label_smoothing * smooth) * mask, mask


def label_smoothed_nll(labels, logits, label_smoothing=0.1):
    """Summed label-smoothed negative log-likelihood over the real (non-pad) tokens.

    Args:
        labels: (B, T) integer ids, pad id 0 ignored.
        logits: (B, T, V) logits.

    Returns:
        (loss_sum, token_count): float32 scalars over this batch (this replica).
    """
    per_token, mask = label_smoothed_per_token(labels, logits, label_smoothing)
    return tf.reduce_sum(per_token), tf.reduce_sum(mask)


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

    Takes integer targets and logits and ignores pad id 0. `call` gives the per-token
    losses (B, T) (0 at pad tokens); the reduction weighs them by `sample_weight`, per
    example (B,) or per token (B, T), as Keras losses do, with real target tokens in the
    place of Keras' batch size:

    - "sum_over_batch_size" (default) and "mean": sum(w * loss) / (real target tokens),
      the paper's token mean when no weights are given. As in Keras, a token of weight 0
      adds nothing to the sum and still counts in the divisor.
    - "mean_with_sample_weight": sum(w * loss) / sum(w over real target tokens), the
      weighted token mean: an example of weight 0 does not count at all.
    - "sum": sum(w * loss). None / "none": the (B, T) weighted per-token losses.

    Under a distribution strategy the divisors are those of the whole global batch (all
    replicas), so the summed gradients are those of the global mean, whatever the
    replicas' token counts. This relies on Keras (and tfxformer's training loop) summing
    replica gradients, which both do.

    Args:
        label_smoothing: ε_ls (0.1).
        reduction: as `keras.losses.Loss`, see above.

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
        """(B, T) labels, (B, T, V) logits -> (B, T) per-token losses, 0 at pad tokens."""
        return label_smoothed_per_token(y_true, y_pred, self.label_smoothing)[0]

    def __call__(self, y_true, y_pred, sample_weight=None):
        with tf.name_scope(self.name):
            per_token, mask = label_smoothed_per_token(y_true, y_pred, self.label_smoothing)
            keras_mask = getattr(y_pred, "_keras_mask", None)  # keras.src get_keras_mask
            if keras_mask is not None:  # a Keras mask on the logits, as keras.losses.Loss
                mask *= tf.cast(tf.broadcast_to(keras_mask, tf.shape(mask)), tf.float32)
            weights = mask if sample_weight is None else mask * token_weights(
                sample_weight, mask)
            weighted = per_token * weights
            if self.reduction in (None, "none"):
                return weighted
            total = tf.reduce_sum(weighted)
            if self.reduction == "sum":
                return total
            divisor = weights if self.reduction == "mean_with_sample_weight" else mask
            # A scalar is returned as is by Keras (no per-replica rescaling).
            return tf.math.divide_no_nan(total, global_sum(tf.reduce_sum(divisor)))

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing)
        return config


def token_weights(sample_weight, mask):
    """Per-example (B,) / (B, 1) or per-token (B, T) weights -> (B, T) float32."""
    weights = tf.cast(tf.convert_to_tensor(sample_weight), tf.float32)
    if weights.shape.rank not in (0, 1, 2):
        raise ValueError("sample_weight must be a scalar, per example (B,) or per token "
                         f"(B, T), got shape {weights.shape}.")
    if weights.shape.rank == 1:
        weights = weights[:, None]
    return tf.broadcast_to(weights, tf.shape(mask))
