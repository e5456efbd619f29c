"""What the encoder and decoder share (§3.1): the residual block around each sub-layer, the
settings of one layer, and the stack of N identical layers."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer import checks
from tfxformer.config import ModelConfig
from tfxformer.layers.attention import MultiHeadAttention
from tfxformer.layers.feed_forward import PositionwiseFeedForward
from tfxformer.layers.norm import LayerNorm

__all__ = [
    "LayerStack", "ResidualBlock", "TransformerBlock",
]

_BASE = ModelConfig()  # the defaults of the layers' settings: the paper's base model


@keras.saving.register_keras_serializable(package="tfxformer")
class ResidualBlock(keras.layers.Layer):
    """Residual connection, dropout and layer normalization around one sub-layer (§3.1, §5.4).

    Post-norm, as the paper: "LayerNorm(x + Sublayer(x))", with dropout "to the output of
    each sub-layer, before it is added to the sub-layer input". Pre-norm (an option, the
    tensor2tensor v2 / Model Garden default): x + Dropout(Sublayer(LayerNorm(x))).
    LayerNormalization computes in float32 under mixed precision (Keras does so inside).

    Use: `out = block(x, sublayer=lambda y: sublayer(y, ...), training=...)`, where the
    sublayer returns one tensor; or, when the sublayer returns more (attention weights, a
    cache), `y = block.sublayer_input(x)`, then `out = block.combine(x, sublayer(y)[0])`.
    """

    def __init__(self, dropout=_BASE.dropout, norm_first=_BASE.norm_first,
                 layer_norm_epsilon=_BASE.layer_norm_epsilon, **kwargs):
        super().__init__(**kwargs)
        self.dropout = float(dropout)
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, name="norm", dtype=self.dtype_policy)
        self.residual_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.supports_masking = True  # position-wise: the input's Keras mask is the output's

    def build(self, input_shape):
        self.norm.build(input_shape)
        self.built = True

    def sublayer_input(self, x):
        """What the sub-layer sees: LayerNorm(x) with pre-norm, x itself with post-norm."""
        return self.norm(x) if self.norm_first else x

    def combine(self, x, result, training=None):
        """x + Dropout(result), then LayerNorm with post-norm."""
        y = x + self.residual_dropout(result, training=training)
        return y if self.norm_first else self.norm(y)

    def call(self, x, sublayer, training=None):
        result = sublayer(self.sublayer_input(x))
        if not tf.is_tensor(result):
            raise ValueError("ResidualBlock's `sublayer` must return one tensor, got "
                             f"{type(result).__name__}; use sublayer_input()/combine() for "
                             "a sub-layer that returns more.")
        return self.combine(x, result, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, norm_first=self.norm_first,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


class TransformerBlock(keras.layers.Layer):
    """The settings of one encoder or decoder layer, and its feed-forward sub-layer (§3.1, §3.3).

    The base of :class:`EncoderLayer` and :class:`DecoderLayer`; the defaults of their
    arguments are :class:`tfxformer.config.ModelConfig`'s.

    Args:
        d_model, num_heads, d_ff: widths (§3.2.2, §3.3).
        dropout: residual dropout P_drop (§5.4, 0.1).
        attention_dropout, activation_dropout: extra dropouts (departures, default 0).
        norm_first: pre-norm instead of the paper's post-norm (departure, option).
        layer_norm_epsilon: LayerNorm epsilon (1e-6).
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=_BASE.dropout,
                 attention_dropout=_BASE.attention_dropout,
                 activation_dropout=_BASE.activation_dropout, norm_first=_BASE.norm_first,
                 layer_norm_epsilon=_BASE.layer_norm_epsilon, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.dropout, self.attention_dropout = float(dropout), float(attention_dropout)
        self.activation_dropout = float(activation_dropout)
        self.norm_first, self.layer_norm_epsilon = bool(norm_first), float(layer_norm_epsilon)
        self.supports_masking = True

    def make_attention(self, name):
        """A MultiHeadAttention sub-layer with this layer's heads, width and dropout."""
        return MultiHeadAttention(self.num_heads, self.d_model, dropout=self.attention_dropout,
                                  name=name, dtype=self.dtype_policy)

    def make_feed_forward(self):
        """The position-wise feed-forward sub-layer (§3.3)."""
        return PositionwiseFeedForward(self.d_ff, self.d_model, dropout=self.activation_dropout,
                                       name="feed_forward", dtype=self.dtype_policy)

    def residual_block(self, name):
        """A ResidualBlock with this layer's dropout, norm placement and epsilon."""
        return ResidualBlock(dropout=self.dropout, norm_first=self.norm_first,
                             layer_norm_epsilon=self.layer_norm_epsilon, name=name,
                             dtype=self.dtype_policy)

    def block_config(self) -> dict:
        """The constructor arguments of this layer (those of `TransformerBlock.__init__`)."""
        return {name: getattr(self, name) for name in _BLOCK_SETTINGS}

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        for layer in self._sublayers():
            layer.build(input_shape)
        self.built = True

    def _sublayers(self):
        """The sub-layers and residual blocks, built on the input shape."""
        raise NotImplementedError

    def _feed_forward(self, x, training):
        return self.feed_forward_block(
            x, sublayer=lambda y: self.feed_forward(y, training=training), training=training)

    def compute_mask(self, inputs, previous_mask=None):
        """Position-wise output: the input's Keras mask is passed on."""
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(self.block_config())
        return config


# TransformerBlock's constructor arguments, which LayerStack passes to each layer.
_BLOCK_SETTINGS = ("d_model", "num_heads", "d_ff", "dropout", "attention_dropout",
                  "activation_dropout", "norm_first", "layer_norm_epsilon")


class LayerStack(keras.layers.Layer):
    """N identical layers of `layer_class` (§3.1: "N = 6"), then a final LayerNorm with
    pre-norm (pre-norm stacks need it). The base of :class:`Encoder` and :class:`Decoder`.

    Args:
        num_layers: N.
        d_model, num_heads, d_ff and the keyword arguments of :class:`TransformerBlock`
            (dropout, attention_dropout, activation_dropout, norm_first,
            layer_norm_epsilon), with its defaults; other keyword arguments go to
            keras.layers.Layer (name, dtype, ...).
    """

    layer_class: type = TransformerBlock

    def __init__(self, num_layers, d_model, num_heads, d_ff, **kwargs):
        settings = {k: kwargs.pop(k) for k in _BLOCK_SETTINGS[3:] if k in kwargs}
        super().__init__(**kwargs)
        self.num_layers = checks.integer(num_layers, "num_layers", 1)
        self.supports_masking = True
        # Each layer is its own attribute: Keras tracks layers kept in a list for .keras
        # files but not for tf.train.Checkpoint (keras-team/keras#18398).
        for i in range(self.num_layers):
            setattr(self, f"layer_{i}", self.layer_class(
                d_model, num_heads, d_ff, name=f"layer_{i}", dtype=self.dtype_policy,
                **settings))
        self.final_norm = None
        if self.layer_0.norm_first:
            self.final_norm = LayerNorm(
                epsilon=self.layer_0.layer_norm_epsilon, name="final_norm",
                dtype=self.dtype_policy)

    @property
    def stack(self) -> list:
        """The N layers, bottom first."""
        return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

    def block_config(self) -> dict:
        """The layers' constructor arguments (one TransformerBlock's)."""
        return self.layer_0.block_config()

    def build(self, input_shape):
        for layer in self.stack:
            layer.build(input_shape)
        if self.final_norm is not None:
            self.final_norm.build(input_shape)
        self.built = True

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def compute_mask(self, inputs, previous_mask=None):
        """Position-wise output: the input's Keras mask is passed on."""
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.block_config())
        return config


def keras_mask_or(explicit, keras_mask, name):
    """An explicit (B, L) bool padding mask if given, else the input's Keras mask as bool."""
    if explicit is not None or keras_mask is None:
        return explicit
    if keras_mask.shape.rank is not None and keras_mask.shape.rank != 2:
        raise ValueError(f"The Keras mask used as `{name}` must have shape (B, L), got "
                         f"{keras_mask.shape}.")
    return tf.cast(keras_mask, tf.bool)
