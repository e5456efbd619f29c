"""Label-smoothed cross-entropy (§5.4), normalised by the real target tokens of the global batch."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.ids import PAD_ID

__all__ = [
    "GUIDED_ALIGNMENT_WEIGHT", "LabelSmoothedCrossEntropy", "fused_label_smoothed_nll",
    "guided_alignment_nll", "label_smoothed_nll", "label_smoothed_per_token", "token_weights",
]


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


def r_drop_label_smoothed_nll(labels, logits_a, logits_b, label_smoothing=0.1, alpha=0.0):
    """R-Drop (Liang et al., 2021): the label-smoothed NLL of two dropout passes of the same
    batch and a symmetric KL term that pulls their predictions together.

    The paper's per-token loss is `NLL_a + NLL_b + alpha * (KL(P_a||P_b) + KL(P_b||P_a)) / 2`;
    this is half of it, `(NLL_a + NLL_b) / 2 + alpha * (KL(P_a||P_b) + KL(P_b||P_a)) / 4`,
    so that at alpha = 0 it is the mean of two ordinary losses (the logged loss stays
    comparable) with the paper's balance between the two terms (Adam's updates do not
    change with a constant factor on the loss). The KL term is in float32 over the whole
    vocabulary and counts real (non-pad) target tokens only.

    Args:
        labels: (B, T) integer ids, pad id 0 ignored.
        logits_a, logits_b: (B, T, V) logits of two passes with independent dropout.
        label_smoothing: ε_ls of both NLL terms.
        alpha: weight of the KL term (the paper's α; 0 = no R-Drop term).

    Returns:
        (loss_sum, token_count): float32 scalars over this batch (this replica).
    """
    nll_a, mask = label_smoothed_per_token(labels, logits_a, label_smoothing)
    nll_b, _ = label_smoothed_per_token(labels, logits_b, label_smoothing)
    log_a = tf.nn.log_softmax(tf.cast(logits_a, tf.float32), axis=-1)
    log_b = tf.nn.log_softmax(tf.cast(logits_b, tf.float32), axis=-1)
    # KL(a||b) + KL(b||a) = sum_v (p_a - p_b) (log p_a - log p_b)
    symmetric_kl = tf.reduce_sum((tf.exp(log_a) - tf.exp(log_b)) * (log_a - log_b), axis=-1)
    per_token = 0.5 * (nll_a + nll_b) + 0.25 * float(alpha) * symmetric_kl * mask
    return tf.reduce_sum(per_token), tf.reduce_sum(mask)


# Garg et al. (2019)'s λ: the weight of the alignment loss beside the translation loss.
GUIDED_ALIGNMENT_WEIGHT = 0.05


def guided_alignment_nll(attention, links):
    """Guided alignment (Garg et al., 2019): the cross-entropy of an attention against
    word links, summed over the target pieces that have links.

    Each target piece t with links is to attend to its linked source pieces evenly: its
    target row is `links[t] / sum(links[t])`, and its loss `-sum_s target[t, s] *
    log attention[t, s]`. A piece without links (EOS, padding, an unaligned word) adds
    nothing.

    Args:
        attention: (B, T, S) float32 attention probabilities of the supervised head(s)
            (:func:`tfxformer.layers.attention.head_average`).
        links: (B, T, S) float32 0/1 piece links (:mod:`tfxformer.data.alignments`).

    Returns:
        (loss_sum, linked_pieces): float32 scalars over this batch (this replica).
    """
    links = tf.cast(links, tf.float32)
    total = tf.reduce_sum(links, axis=-1, keepdims=True)
    target = links / tf.maximum(total, 1.0)
    log_attention = tf.math.log(tf.maximum(tf.cast(attention, tf.float32), 1e-9))
    return (-tf.reduce_sum(target * log_attention),
            tf.reduce_sum(tf.cast(total > 0, tf.float32)))


# Logits per chunk of the fused loss: 2^25 float32 = 128 MiB (1,048 rows at V = 32,000).
FUSED_CHUNK_ELEMENTS = 2 ** 25


def fused_label_smoothed_nll(hidden, embeddings, labels, weights, label_smoothing=0.1,
                             chunk_elements=FUSED_CHUNK_ELEMENTS):
    """sum(weights * label-smoothed NLL) of the logits `hidden @ embeddingsᵀ`, never
    holding the (B, T, V) logits: the projection and the loss run in chunks of rows.

    The same function as :func:`label_smoothed_per_token` on
    `SharedEmbedding.logits(hidden)` (§3.4's tied pre-softmax projection, §5.4's label
    smoothing), weighted and summed, for training at a lower peak memory. The base model's
    bench batch (4,096 target tokens, V = 32,000) has 500 MiB of float32 logits; on them the
    loss and its gradient hold two or more such tensors at once (logits, log-softmax, the
    gradients of the gather, the mean and the log-softmax), and the step's allocator peak is
    1 GiB higher than with this function (bench/README.md, "Training memory"). Here each
    chunk of at most `chunk_elements` logits is made, turned into its loss and its logit
    gradient `w * (softmax - (1 - ε) onehot - ε / V)` (one fused sparse cross-entropy
    kernel), and multiplied into the gradients of `hidden` and `embeddings` at once, in the
    forward pass; the backward pass only scales those by the incoming gradient. The GEMMs
    are the unfused path's (same shapes per row, in the compute dtype of `hidden`), nothing
    is recomputed.

    Because the logit gradients are formed in the forward pass, put every factor of the
    loss (normalisation, loss scale) into `weights`, so that they are formed at their final
    scale (a float16 gradient that is scaled only afterwards would underflow).

    Args:
        hidden: (B, T, D) or (N, D) decoder outputs, in the compute dtype.
        embeddings: (V, D) float32 embedding matrix (the variable, read inside the tape).
        labels: (B, T) or (N,) integer ids; pad ids get a weight from `weights` like
            any other (pass a mask).
        weights: (B, T) or (N,) float32 per-token weights.
        label_smoothing: ε_ls.
        chunk_elements: logits per chunk (rows = max(1, chunk_elements // V)); None: all
            rows in one chunk, without a loop. Use None under XLA: there a loop in the
            program (even one XLA removes) made XLA's CPU compiler fuse the dropout masks'
            random number generation into their consumers: a training step of the tiny
            model took 9x as long (the Trainer passes None with jit_compile=True); XLA
            plans the buffers itself.

    Returns:
        The float32 scalar sum(weights * per-token loss), differentiable with respect to
        `hidden` and `embeddings` (not `labels` or `weights`).
    """
    depth = hidden.shape[-1]
    rows = tf.reshape(hidden, [-1, tf.shape(hidden)[-1]])
    rows.set_shape([None, depth])
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    weights = tf.reshape(tf.cast(weights, tf.float32), [-1])
    epsilon = float(label_smoothing)

    @tf.custom_gradient
    def fused(rows, embeddings):
        loss, d_rows, d_embeddings = _chunked_loss_and_gradients(
            rows, embeddings, labels, weights, epsilon, chunk_elements)

        def grad(upstream):
            return (d_rows * tf.cast(upstream, d_rows.dtype),
                    d_embeddings * tf.cast(upstream, d_embeddings.dtype))
        return loss, grad

    return fused(rows, tf.convert_to_tensor(embeddings))


def _chunk_loss_and_gradients(h, kernel, y, w, epsilon):
    """(loss sum, d loss / d h, d loss / d kernel as float32) of rows `h` (C, D)."""
    logits = tf.cast(tf.matmul(h, kernel, transpose_b=True), tf.float32)  # (C, V)
    # nll = logsumexp - logit[y] and its gradient softmax - onehot(y): one kernel.
    nll, d_logits = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=logits, labels=y)
    label_logit = tf.gather(logits, y, batch_dims=1)
    # -mean(log_softmax) = logsumexp - mean(logits)
    smooth = nll + label_logit - tf.reduce_mean(logits, axis=-1)
    loss = tf.reduce_sum(w * ((1.0 - epsilon) * nll + epsilon * smooth))
    # d loss / d logits = w * (softmax - (1 - ε) onehot - ε / V)
    rows = tf.shape(y)[0]
    uniform = epsilon / tf.cast(tf.shape(logits)[1], tf.float32)
    d_logits = tf.tensor_scatter_nd_add(d_logits - uniform, tf.stack([tf.range(rows), y], 1),
                                        tf.fill([rows], epsilon))
    d_logits = tf.cast(d_logits * w[:, None], h.dtype)
    d_h = tf.matmul(d_logits, kernel)  # (C, D)
    d_kernel = tf.cast(tf.matmul(d_logits, h, transpose_a=True), tf.float32)  # (V, D)
    return loss, d_h, d_kernel


def _chunked_loss_and_gradients(rows, embeddings, labels, weights, epsilon, chunk_elements):
    """(loss sum, d loss / d rows, d loss / d embeddings), one chunk of rows at a time."""
    kernel = tf.cast(embeddings, rows.dtype)  # as SharedEmbedding.logits
    if chunk_elements is None:
        loss, d_rows, d_embeddings = _chunk_loss_and_gradients(rows, kernel, labels, weights,
                                                               epsilon)
        return loss, d_rows, tf.cast(d_embeddings, embeddings.dtype)
    n = tf.shape(rows)[0]
    max_rows = tf.maximum(chunk_elements // tf.shape(embeddings)[0], 1)
    chunks = tf.maximum((n + max_rows - 1) // max_rows, 1)
    size = (n + chunks - 1) // chunks  # balanced chunks; padded rows have weight 0
    pad = chunks * size - n
    rows_p = tf.pad(rows, [[0, pad], [0, 0]])
    labels_p = tf.pad(labels, [[0, pad]])
    weights_p = tf.pad(weights, [[0, pad]])

    def chunk(i):
        """Rows [i * size, (i + 1) * size)."""
        start = i * size
        return _chunk_loss_and_gradients(
            tf.slice(rows_p, [start, 0], [size, -1]), kernel,
            tf.slice(labels_p, [start], [size]), tf.slice(weights_p, [start], [size]), epsilon)

    def body(i, loss, d_embeddings, d_rows):
        chunk_loss, d_h, d_kernel = chunk(i)
        return i + 1, loss + chunk_loss, d_embeddings + d_kernel, d_rows.write(i, d_h)

    # Chunk 0 starts the sums (a zeros (V, D) start would be folded into a graph constant
    # that stays allocated), then one chunk at a time: parallel iterations would hold
    # several chunks' logits at once.
    loss, d_h, d_embeddings = chunk(0)
    d_rows = tf.TensorArray(rows.dtype, size=chunks, element_shape=[None, rows.shape[-1]])
    _, loss, d_embeddings, d_rows = tf.while_loop(
        lambda i, *_: i < chunks, body, (tf.constant(1), loss, d_embeddings,
                                         d_rows.write(0, d_h)),
        parallel_iterations=1)
    d_rows = d_rows.concat()[:n]
    return loss, d_rows, tf.cast(d_embeddings, embeddings.dtype)


def _global_sum(value):
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
            return tf.math.divide_no_nan(total, _global_sum(tf.reduce_sum(divisor)))

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
