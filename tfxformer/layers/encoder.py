"""Encoder layer and stack (§3.1, left half of Figure 1)."""

from __future__ import annotations

import keras

from tfxformer.layers.attention import MultiHeadAttention
from tfxformer.layers.feed_forward import PositionwiseFeedForward


@keras.saving.register_keras_serializable(package="tfxformer")
class ResidualBlock(keras.layers.Layer):
    """Residual connection, dropout and layer normalization around one sub-layer (§3.1, §5.4).

    Post-norm, as the paper: "LayerNorm(x + Sublayer(x))", with dropout "to the output of
    each sub-layer, before it is added to the sub-layer input". Pre-norm (an option, the
    tensor2tensor v2 / Model Garden default): x + Dropout(Sublayer(LayerNorm(x))).
    LayerNormalization computes in float32 under mixed precision (Keras does so inside).

    Use: `out = block(x, sublayer=lambda y: sublayer(y, ...), training=...)`.
    """

    def __init__(self, dropout=0.1, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="norm", dtype=self.dtype_policy)
        self.residual_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.built = True

    def call(self, x, sublayer, training=None):
        """Returns the block output, plus whatever else `sublayer` returned (as a tuple)."""
        result = sublayer(self.norm(x) if self.norm_first else x)
        extra = ()
        if isinstance(result, tuple):
            result, extra = result[0], tuple(result[1:])
        y = x + self.residual_dropout(result, training=training)
        y = y if self.norm_first else self.norm(y)
        return (y,) + extra if extra else y

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, norm_first=self.norm_first,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


def _layer_kwargs(layer):
    return dict(dropout=layer.dropout, norm_first=layer.norm_first,
                layer_norm_epsilon=layer.layer_norm_epsilon, dtype=layer.dtype_policy)


@keras.saving.register_keras_serializable(package="tfxformer")
class EncoderLayer(keras.layers.Layer):
    """One encoder layer: self-attention, then a feed-forward network (§3.1).

    "Each layer has two sub-layers. The first is a multi-head self-attention mechanism,
    and the second is a simple, position-wise fully connected feed-forward network."
    Each is wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-norm, the paper's), or
    x + Dropout(Sublayer(LayerNorm(x))) with `norm_first=True` (departure, option).

    Args:
        d_model, num_heads, d_ff: widths (§3.2.2, §3.3).
        dropout: residual dropout P_drop (§5.4).
        attention_dropout, activation_dropout: extra dropouts (departures, default 0).
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.

    Call arguments:
        x: (B, S, D) inputs.
        padding_mask: optional (B, S) bool, True for real tokens.
        return_attention_scores: also return the (B, H, S, S) self-attention weights.

    Returns:
        (B, S, D), and the weights if asked.

    Example:
    >>> EncoderLayer(d_model=8, num_heads=2, d_ff=16)(tf.zeros((2, 3, 8))).shape
    TensorShape([2, 3, 8])
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 activation_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.dropout, self.attention_dropout = float(dropout), float(attention_dropout)
        self.activation_dropout = float(activation_dropout)
        self.norm_first, self.layer_norm_epsilon = bool(norm_first), float(layer_norm_epsilon)
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            num_heads, d_model, dropout=attention_dropout, name="self_attention", dtype=policy)
        self.feed_forward = PositionwiseFeedForward(
            d_ff, d_model, dropout=activation_dropout, name="feed_forward", dtype=policy)
        self.attention_block = ResidualBlock(name="attention_block", **_layer_kwargs(self))
        self.feed_forward_block = ResidualBlock(name="feed_forward_block", **_layer_kwargs(self))

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        self.self_attention.build(input_shape)
        self.feed_forward.build(input_shape)
        self.attention_block.build(input_shape)
        self.feed_forward_block.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None):
        def attend(y):
            return self.self_attention(
                y, y, padding_mask=padding_mask,
                return_attention_scores=return_attention_scores, training=training)

        out = self.attention_block(x, sublayer=attend, training=training)
        x, weights = out if return_attention_scores else (out, None)
        x = self.feed_forward_block(
            x, sublayer=lambda y: self.feed_forward(y, training=training), training=training)
        return (x, weights) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      activation_dropout=self.activation_dropout, norm_first=self.norm_first,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


@keras.saving.register_keras_serializable(package="tfxformer")
class Encoder(keras.layers.Layer):
    """A stack of `num_layers` identical encoder layers (§3.1: "N = 6").

    Takes embedded inputs (token embedding + positional encoding, see
    :class:`tfxformer.Transformer`). With `norm_first=True` a final LayerNorm follows
    the stack, as pre-norm models need.

    Args:
        num_layers: N. The other arguments are those of :class:`EncoderLayer`.

    Call arguments:
        x: (B, S, D); padding_mask: optional (B, S) bool, True for real tokens;
        return_attention_scores: also return a list of N (B, H, S, S) weights.

    Example:
    >>> Encoder(2, d_model=8, num_heads=2, d_ff=16)(tf.zeros((2, 3, 8))).shape
    TensorShape([2, 3, 8])
    """

    def __init__(self, num_layers, d_model, num_heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 activation_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = int(num_layers)
        self.layer_kwargs = dict(
            d_model=int(d_model), num_heads=int(num_heads), d_ff=int(d_ff), dropout=float(dropout),
            attention_dropout=float(attention_dropout),
            activation_dropout=float(activation_dropout), norm_first=bool(norm_first),
            layer_norm_epsilon=float(layer_norm_epsilon))
        stack = [EncoderLayer(name=f"layer_{i}", dtype=self.dtype_policy,
                                    **self.layer_kwargs) for i in range(self.num_layers)]
        # Each layer is its own attribute: Keras tracks layers kept in a list for .keras
        # files but not for tf.train.Checkpoint (keras-team/keras#18398).
        for i, layer in enumerate(stack):
            setattr(self, f"layer_{i}", layer)
        self.final_norm = None
        if norm_first:
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_norm", dtype=self.dtype_policy)

    @property
    def stack(self) -> list:
        """The N layers, bottom first."""
        return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

    def build(self, input_shape):
        for layer in self.stack:
            layer.build(input_shape)
        if self.final_norm is not None:
            self.final_norm.build(input_shape)
        self.built = True

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None):
        all_weights = []
        for layer in self.stack:
            x = layer(x, padding_mask=padding_mask,
                      return_attention_scores=return_attention_scores, training=training)
            if return_attention_scores:
                x, weights = x
                all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_kwargs)
        return config
