"""Shared token embedding and pre-softmax projection (§3.4)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.layers.ops import matmul_last


@keras.saving.register_keras_serializable(package="tfxformer")
class SharedEmbedding(keras.layers.Layer):
    """One weight matrix for the source and target embeddings and the output projection.

    §3.4: "we share the same weight matrix between the two embedding layers and the
    pre-softmax linear transformation ... In the embedding layers, we multiply those
    weights by sqrt(d_model)." Weights start as N(0, d_model^-0.5), so the scaled
    embeddings have unit variance (as tensor2tensor).

    Args:
        vocab_size: V, number of token ids (id 0 is the padding id).
        d_model: D, embedding width.

    Call arguments:
        ids: (B, L) integer ids.

    Returns:
        `call`: (B, L, D) embeddings times sqrt(D), in the compute dtype.
        `logits(x)`: (B, L, V) float32 pre-softmax logits x Eᵀ.

    Example:
    >>> import tensorflow as tf
    >>> emb = SharedEmbedding(vocab_size=10, d_model=4)
    >>> emb(tf.constant([[1, 2, 0]])).shape, emb.logits(tf.zeros((1, 3, 4))).shape
    (TensorShape([1, 3, 4]), TensorShape([1, 3, 10]))
    """

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        if self.vocab_size < 2 or self.d_model < 1:
            raise ValueError(
                f"Need vocab_size >= 2 and d_model >= 1, got {self.vocab_size}, {self.d_model}.")

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.built = True

    def call(self, ids):
        vectors = tf.gather(self.embeddings, tf.cast(ids, tf.int32))  # (B, L, D), float32
        return tf.cast(vectors * self.d_model ** 0.5, self.compute_dtype)

    def logits(self, x):
        """(..., D) -> (..., V) float32 logits through the transposed embedding matrix."""
        kernel = tf.cast(self.embeddings, x.dtype)
        return tf.cast(matmul_last(x, kernel, transpose_b=True), tf.float32)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model)
        return config
