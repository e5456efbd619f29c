"""Decoder layer and stack (§3.1, right half of Figure 1), with a key/value cache."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.layers.block import LayerStack, TransformerBlock, keras_mask_or
from tfxformer.layers.masks import causal_mask


def _scores_spec(x, memory, num_heads):
    batch, length = x.shape[0], x.shape[1]
    return {"self": keras.KerasTensor((batch, num_heads, length, length), "float32"),
            "cross": keras.KerasTensor((batch, num_heads, length, memory.shape[1]), "float32")}


def _output_spec(layer, x, memory, return_attention_scores, num_heads, num_layers=None):
    """The output spec of a decoder layer (`num_layers` None) or stack: `x`'s shape in its
    compute dtype, with the attention scores' (one dict, or a list of one per layer)."""
    output = keras.KerasTensor(x.shape, layer.compute_dtype)
    if not return_attention_scores:
        return output
    if num_layers is None:
        return output, _scores_spec(x, memory, num_heads)
    return output, [_scores_spec(x, memory, num_heads) for _ in range(num_layers)]


def _check_memory_width(memory_shape, d_model):
    if memory_shape is None:
        return
    memory_shape = tuple(memory_shape)
    if len(memory_shape) != 3 or memory_shape[-1] not in (None, d_model):
        raise ValueError(f"`memory_shape` must be (B, S, {d_model}) (the encoder output, "
                         f"width d_model), got {memory_shape}.")


@keras.saving.register_keras_serializable(package="tfxformer")
class DecoderLayer(TransformerBlock):
    """One decoder layer: causal self-attention, encoder–decoder attention, feed-forward (§3.1).

    "In addition to the two sub-layers in each encoder layer, the decoder inserts a third
    sub-layer, which performs multi-head attention over the output of the encoder stack
    ... We also modify the self-attention sub-layer in the decoder stack to prevent
    positions from attending to subsequent positions." Post-norm by default, pre-norm with
    `norm_first=True` (departure, option).

    Args: as :class:`tfxformer.layers.EncoderLayer`.

    Call arguments (`call`, teacher forcing):
        x: (B, T, D) target-side inputs.
        memory: (B, S, D) encoder output.
        memory_padding_mask: optional (B, S) bool, True for real source tokens. When
            None, the Keras mask of `memory` is used.
        return_attention_scores: also return {"self": (B, H, T, T), "cross": (B, H, T, S)}.
        The Keras mask of `x` (if any) also masks padded target keys in the
        self-attention, and is passed on to the output.

    Returns:
        `call`: (B, T, D), or `(output, weights)` with `return_attention_scores=True`.
        :meth:`call_cached`: always `(output, cache)`.

    Example:
    >>> import tensorflow as tf
    >>> layer = DecoderLayer(d_model=8, num_heads=2, d_ff=16)
    >>> layer(tf.zeros((2, 3, 8)), tf.zeros((2, 5, 8))).shape
    TensorShape([2, 3, 8])
    """

    def __init__(self, d_model, num_heads, d_ff, **kwargs):
        super().__init__(d_model, num_heads, d_ff, **kwargs)
        self.self_attention = self.make_attention("self_attention")
        self.cross_attention = self.make_attention("cross_attention")
        self.feed_forward = self.make_feed_forward()
        self.self_attention_block = self.residual_block("self_attention_block")
        self.cross_attention_block = self.residual_block("cross_attention_block")
        self.feed_forward_block = self.residual_block("feed_forward_block")

    def build(self, x_shape, memory_shape=None):
        """Builds on the target shape `x_shape` (B, T, D), given by position (as
        `build(input_shape)`) or by name as Keras 3 passes a multi-input layer's shapes
        (`build(x_shape=..., memory_shape=...)`); `memory_shape` (B, S, D) must have
        the same width D."""
        _check_memory_width(memory_shape, self.d_model)
        super().build(x_shape)

    def _sublayers(self):
        return [self.self_attention, self.cross_attention, self.feed_forward,
                self.self_attention_block, self.cross_attention_block, self.feed_forward_block]

    def call(self, x, memory, memory_padding_mask=None, return_attention_scores=False,
             training=None, x_mask=None, memory_mask=None):
        memory_padding_mask = keras_mask_or(memory_padding_mask, memory_mask,
                                            "memory_padding_mask")
        self_mask = causal_mask(tf.shape(x)[1])[None]  # (1, T, T)
        target_mask = keras_mask_or(None, x_mask, "x's Keras mask")
        if target_mask is not None:
            self_mask = self_mask & target_mask[:, None, :]  # (B, T, T)
        weights = {}

        def sublayer(block, attention, name, value, **kwargs):
            y = block.sublayer_input(x)
            out = attention(y, y if value is None else value,
                            return_attention_scores=return_attention_scores,
                            training=training, **kwargs)
            out, weights[name] = out if return_attention_scores else (out, None)
            return block.combine(x, out, training=training)

        x = sublayer(self.self_attention_block, self.self_attention, "self", None,
                     attention_mask=self_mask)
        x = sublayer(self.cross_attention_block, self.cross_attention, "cross", memory,
                     padding_mask=memory_padding_mask)
        x = self._feed_forward(x, training)
        return (x, weights) if return_attention_scores else x

    def call_cached(self, x, cache, cache_index, memory_padding_mask=None, static_cache=True,
                    beams=1, training=None):
        """One incremental decoding call; returns `(output (N, T, D), updated cache)`.

        Args:
            x: (N, T, D), the embedded tokens at positions [cache_index, cache_index + T).
            cache: {"self": {"key", "value"}: (N, H, L, K), "cross": {"key", "value"}:
                (B, H, S, K)}, from :meth:`Decoder.init_cache`. x's keys/values are written
                at cache_index into its L slots (`static_cache=True`), or appended to a
                growing cache (`static_cache=False`).
            memory_padding_mask: optional (B, S) bool, the memory's batch.
            beams: rows of x per memory row, N = B * beams (row b * beams + k is
                hypothesis k of sentence b); the memory is read once per sentence.
        """
        if not self.built:
            self.build(x.shape)
        length = tf.shape(x)[1]
        # Query i sits at cache_index + i and may see cached keys 0 .. cache_index + i.
        slots = tf.shape(cache["self"]["key"])[2] + (0 if static_cache else length)
        visible = tf.range(slots)[None, :] <= tf.range(length)[:, None] + cache_index
        y = self.self_attention_block.sublayer_input(x)
        out, self_cache = self.self_attention.call_cached(
            y, cache["self"], cache_index, attention_mask=visible[None],
            static_cache=static_cache, training=training)
        x = self.self_attention_block.combine(x, out, training=training)
        y = self.cross_attention_block.sublayer_input(x)
        out, cross_cache = self.cross_attention.call_cached(
            y, cache["cross"], padding_mask=memory_padding_mask, beams=beams,
            training=training)
        x = self.cross_attention_block.combine(x, out, training=training)
        x = self._feed_forward(x, training)
        return x, {"self": self_cache, "cross": cross_cache}

    def compute_output_spec(self, x, memory, memory_padding_mask=None,
                            return_attention_scores=False, training=None, x_mask=None,
                            memory_mask=None):
        return _output_spec(self, x, memory, return_attention_scores, self.num_heads)


@keras.saving.register_keras_serializable(package="tfxformer")
class Decoder(LayerStack):
    """A stack of `num_layers` identical decoder layers (§3.1: "N = 6"), with a cache.

    Takes embedded target inputs (shifted right, plus positional encoding). With
    `norm_first=True` a final LayerNorm follows the stack.

    Args: `num_layers` and those of :class:`DecoderLayer`.

    Call arguments (`call`, teacher forcing):
        x: (B, T, D); memory: (B, S, D); memory_padding_mask: optional (B, S) (None: the
        Keras mask of `memory`); return_attention_scores: also return a list of
        per-layer {"self", "cross"} weights. Incremental decoding: :meth:`init_cache`,
        then :meth:`call_cached`.

    Returns:
        `call`: (B, T, D), or `(output, [weights of each layer])` with
        `return_attention_scores=True`. :meth:`call_cached`: always `(output, cache)`.

    Example:
    >>> import tensorflow as tf
    >>> dec = Decoder(2, d_model=8, num_heads=2, d_ff=16)
    >>> dec(tf.zeros((2, 3, 8)), tf.zeros((2, 5, 8))).shape
    TensorShape([2, 3, 8])
    """

    layer_class = DecoderLayer

    def build(self, x_shape, memory_shape=None):
        """As :meth:`DecoderLayer.build`: `x_shape` by position or by name, and the
        optional `memory_shape`."""
        _check_memory_width(memory_shape, self.layer_0.d_model)
        super().build(x_shape)

    def init_cache(self, memory, cache_length=None, batch_size=None):
        """Per-layer caches for decoding up to `cache_length` tokens against `memory` (B, S, D).

        Self-attention slots start as zeros (N, H, cache_length, K) for
        `static_cache=True` calls, or empty (N, H, 0, K) with `cache_length=None`: a cache
        that grows, for `static_cache=False` calls. The
        memory's keys/values are projected once here, not at every step. `batch_size` N
        (default B) sizes the self-attention slots, e.g. B·beam for beam search, whose
        beams share the memory's projection (`call_cached(..., beams=beam)`).
        """
        if not self.built:
            self.build(memory.shape)
        batch = tf.shape(memory)[0] if batch_size is None else batch_size
        heads = self.layer_0.num_heads
        head_dim = self.layer_0.d_model // heads
        slots = 0 if cache_length is None else cache_length
        zeros = tf.zeros([batch, heads, slots, head_dim], self.compute_dtype)
        memory = tf.cast(memory, self.compute_dtype)
        return [{"self": {"key": zeros, "value": zeros},
                 "cross": layer.cross_attention.project_key_value(memory)}
                for layer in self.stack]

    def call(self, x, memory, memory_padding_mask=None, return_attention_scores=False,
             training=None, x_mask=None, memory_mask=None):
        memory_padding_mask = keras_mask_or(memory_padding_mask, memory_mask,
                                            "memory_padding_mask")
        all_weights = []
        for layer in self.stack:
            x = layer(x, memory, memory_padding_mask=memory_padding_mask,
                      return_attention_scores=return_attention_scores, training=training,
                      x_mask=x_mask)
            if return_attention_scores:
                x, weights = x
                all_weights.append(weights)
        x = self._finish(x)
        return (x, all_weights) if return_attention_scores else x

    def call_cached(self, x, cache, cache_index, memory_padding_mask=None, static_cache=True,
                    beams=1, training=None):
        """Incremental decoding through the N layers (see :meth:`DecoderLayer.call_cached`);
        returns `(output (N, T, D), updated list of per-layer caches)`."""
        new_cache = []
        for layer, layer_cache in zip(self.stack, cache, strict=True):
            x, layer_cache = layer.call_cached(
                x, layer_cache, cache_index, memory_padding_mask=memory_padding_mask,
                static_cache=static_cache, beams=beams, training=training)
            new_cache.append(layer_cache)
        return self._finish(x), new_cache

    def compute_output_spec(self, x, memory, memory_padding_mask=None,
                            return_attention_scores=False, training=None, x_mask=None,
                            memory_mask=None):
        return _output_spec(self, x, memory, return_attention_scores, self.layer_0.num_heads,
                            self.num_layers)
