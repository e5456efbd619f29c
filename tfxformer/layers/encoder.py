"""Encoder layer and stack (§3.1, left half of Figure 1)."""

from __future__ import annotations

import keras

from tfxformer.layers.block import LayerStack, TransformerBlock, keras_mask_or


def _scores_spec(x, num_heads):
    return keras.KerasTensor((x.shape[0], num_heads, x.shape[1], x.shape[1]), "float32")


@keras.saving.register_keras_serializable(package="tfxformer")
class EncoderLayer(TransformerBlock):
    """One encoder layer: self-attention, then a feed-forward network (§3.1).

    "Each layer has two sub-layers. The first is a multi-head self-attention mechanism,
    and the second is a simple, position-wise fully connected feed-forward network."
    Each is wrapped as LayerNorm(x + Dropout(Sublayer(x))) (post-norm, the paper's), or
    x + Dropout(Sublayer(LayerNorm(x))) with `norm_first=True` (departure, option).

    Args: those of :class:`tfxformer.layers.block.TransformerBlock`: d_model, num_heads,
        d_ff, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        norm_first=False, layer_norm_epsilon=1e-6.

    Call arguments:
        x: (B, S, D) inputs.
        padding_mask: optional (B, S) bool, True for real tokens. When None, the Keras
            mask of `x` is used (e.g. from `keras.layers.Embedding(mask_zero=True)`); it
            is passed on to the output.
        return_attention_scores: also return the (B, H, S, S) self-attention weights.

    Returns:
        (B, S, D), or `(output, weights)` with `return_attention_scores=True`.

    Example:
    >>> import tensorflow as tf
    >>> EncoderLayer(d_model=8, num_heads=2, d_ff=16)(tf.zeros((2, 3, 8))).shape
    TensorShape([2, 3, 8])
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = self.make_attention("self_attention")
        self.feed_forward = self.make_feed_forward()
        self.attention_block = self.residual_block("attention_block")
        self.feed_forward_block = self.residual_block("feed_forward_block")

    def _sublayers(self):
        return [self.self_attention, self.feed_forward, self.attention_block,
                self.feed_forward_block]

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None,
             mask=None):
        padding_mask = keras_mask_or(padding_mask, mask, "padding_mask")
        y = self.attention_block.sublayer_input(x)
        out = self.self_attention(y, y, padding_mask=padding_mask,
                                  return_attention_scores=return_attention_scores,
                                  training=training)
        out, weights = out if return_attention_scores else (out, None)
        x = self.attention_block.combine(x, out, training=training)
        x = self._feed_forward(x, training)
        return (x, weights) if return_attention_scores else x

    def compute_output_spec(self, x, padding_mask=None, return_attention_scores=False,
                            training=None, mask=None):
        output = keras.KerasTensor(x.shape, self.compute_dtype)
        return (output, _scores_spec(x, self.num_heads)) if return_attention_scores else output


@keras.saving.register_keras_serializable(package="tfxformer")
class Encoder(LayerStack):
    """A stack of `num_layers` identical encoder layers (§3.1: "N = 6").

    Takes embedded inputs (token embedding + positional encoding, see
    :class:`tfxformer.Transformer`). With `norm_first=True` a final LayerNorm follows
    the stack, as pre-norm models need.

    Args:
        num_layers: N. The other arguments are those of :class:`EncoderLayer`.

    Call arguments:
        x: (B, S, D); padding_mask: optional (B, S) bool, True for real tokens (None: the
        Keras mask of `x`, passed on to the output);
        return_attention_scores: also return a list of N (B, H, S, S) weights.

    Returns:
        (B, S, D), or `(output, [weights of each layer])` with `return_attention_scores`.

    Example:
    >>> import tensorflow as tf
    >>> Encoder(2, d_model=8, num_heads=2, d_ff=16)(tf.zeros((2, 3, 8))).shape
    TensorShape([2, 3, 8])
    """

    layer_class = EncoderLayer

    def call(self, x, padding_mask=None, return_attention_scores=False, training=None,
             mask=None):
        padding_mask = keras_mask_or(padding_mask, mask, "padding_mask")
        all_weights = []
        for layer in self.stack:
            x = layer(x, padding_mask=padding_mask,
                      return_attention_scores=return_attention_scores, training=training)
            if return_attention_scores:
                x, weights = x
                all_weights.append(weights)
        x = self._finish(x)
        return (x, all_weights) if return_attention_scores else x

    def compute_output_spec(self, x, padding_mask=None, return_attention_scores=False,
                            training=None, mask=None):
        output = keras.KerasTensor(x.shape, self.compute_dtype)
        if not return_attention_scores:
            return output
        heads = self.layer_0.num_heads
        return output, [_scores_spec(x, heads) for _ in range(self.num_layers)]
