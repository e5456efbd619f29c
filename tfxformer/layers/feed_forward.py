"""Position-wise feed-forward network (§3.3)."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="tfxformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2).

    "Applied to each position separately and identically"; inner width d_ff.
    Departure (option, off by default): dropout on the ReLU output (`dropout`), as
    tensor2tensor's `relu_dropout`.

    Args:
        d_ff: inner width (2048 in the base model).
        d_model: output width; defaults to the input width.
        dropout: dropout on the hidden activations (default 0, as in the paper).

    Call arguments:
        inputs: (B, L, D).

    Returns:
        (B, L, D).

    Example:
    >>> import tensorflow as tf
    >>> PositionwiseFeedForward(d_ff=16)(tf.zeros((2, 3, 8))).shape
    TensorShape([2, 3, 8])
    """

    def __init__(self, d_ff, d_model=None, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = int(d_ff)
        self.d_model = None if d_model is None else int(d_model)
        self.dropout = float(dropout)
        self.inner = keras.layers.Dense(self.d_ff, activation="relu", name="inner",
                                        dtype=self.dtype_policy)
        self.activation_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.outer = None
        self.supports_masking = True  # position-wise: the input's Keras mask is the output's

    def build(self, input_shape):
        # The config keeps the argument (None = the input width); the width in use is outer's.
        width = self.d_model or int(input_shape[-1])
        self.outer = keras.layers.Dense(width, name="outer", dtype=self.dtype_policy)
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.activation_dropout(self.inner(inputs), training=training)
        return self.outer(hidden)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.d_model or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(d_ff=self.d_ff, d_model=self.d_model, dropout=self.dropout)
        return config
