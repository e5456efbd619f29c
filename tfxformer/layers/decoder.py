"""Decoder layer and stack (§3.1, right half of Figure 1), with a key/value cache."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.layers.attention import MultiHeadAttention
from tfxformer.layers.encoder import ResidualBlock, _layer_kwargs
from tfxformer.layers.feed_forward import PositionwiseFeedForward
from tfxformer.layers.masks import causal_mask


@keras.saving.register_keras_serializable(package="tfxformer")
class DecoderLayer(keras.layers.Layer):
    """One decoder layer: causal self-attention, encoder–decoder attention, feed-forward (§3.1).

    "In addition to the two sub-layers in each encoder layer, the decoder inserts a third
    sub-layer, which performs multi-head attention over the output of the encoder stack
    ... We also modify the self-attention sub-layer in the decoder stack to prevent
    positions from attending to subsequent positions." Post-norm by default, pre-norm with
    `norm_first=True` (departure, option).

    Args: as :class:`tfxformer.layers.EncoderLayer`.

    Call arguments:
        x: (B, T, D) target-side inputs.
        memory: (B, S, D) encoder output (may be None when `cache` holds its projection).
        memory_padding_mask: optional (B, S) bool, True for real source tokens.
        cache: optional {"self": {"key", "value"}, "cross": {"key", "value"}} with
            (B, H, L, K) self-attention keys/values and (B, H, S, K) projected memory,
            as made by :meth:`Decoder.init_cache`. Requires `cache_index`, the position
            of x's first token; x's keys/values are written there (appended to a
            growing cache with `append_cache=True`).
        append_cache: the self-attention cache grows (see :meth:`Decoder.init_cache`).
        return_attention_scores: also return {"self": (B, H, T, T|L), "cross": (B, H, T, S)}.

    Returns:
        (B, T, D); then the weights if asked; then the updated cache if one was given.
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
        self.cross_attention = MultiHeadAttention(
            num_heads, d_model, dropout=attention_dropout, name="cross_attention", dtype=policy)
        self.feed_forward = PositionwiseFeedForward(
            d_ff, d_model, dropout=activation_dropout, name="feed_forward", dtype=policy)
        self.self_attention_block = ResidualBlock(
            name="self_attention_block", **_layer_kwargs(self))
        self.cross_attention_block = ResidualBlock(
            name="cross_attention_block", **_layer_kwargs(self))
        self.feed_forward_block = ResidualBlock(name="feed_forward_block", **_layer_kwargs(self))

    def build(self, x_shape, memory_shape=None):
        x_shape = tuple(x_shape)
        for layer in (self.self_attention, self.cross_attention, self.feed_forward,
                      self.self_attention_block, self.cross_attention_block,
                      self.feed_forward_block):
            layer.build(x_shape)
        self.built = True

    def call(self, x, memory=None, memory_padding_mask=None, cache=None, cache_index=None,
             append_cache=False, return_attention_scores=False, training=None):
        if cache is not None and cache_index is None:
            raise ValueError("A decoder `cache` needs `cache_index`, the position of x[:, 0].")
        length = tf.shape(x)[1]
        if cache is None:
            self_mask = causal_mask(length)[None]  # (1, T, T)
        else:  # query i sits at cache_index + i and may see cached keys 0..cache_index + i
            slots = tf.shape(cache["self"]["key"])[2] + (length if append_cache else 0)
            keys = tf.range(slots)[None, :]
            self_mask = (keys <= tf.range(length)[:, None] + cache_index)[None]  # (1, T, L)
        cached = cache is not None

        def attend_self(y):
            return self.self_attention(
                y, y, attention_mask=self_mask, cache=cache["self"] if cached else None,
                cache_index=cache_index, append_cache=append_cache,
                return_attention_scores=return_attention_scores,
                training=training)

        def attend_memory(y):
            return self.cross_attention(
                y, memory, padding_mask=memory_padding_mask,
                cache=cache["cross"] if cached else None,
                return_attention_scores=return_attention_scores, training=training)

        weights, new_cache = {}, {}
        out = self.self_attention_block(x, sublayer=attend_self, training=training)
        x, weights["self"], new_cache["self"] = _unpack(out, return_attention_scores, cached)
        out = self.cross_attention_block(x, sublayer=attend_memory, training=training)
        x, weights["cross"], new_cache["cross"] = _unpack(out, return_attention_scores, cached)
        x = self.feed_forward_block(
            x, sublayer=lambda y: self.feed_forward(y, training=training), training=training)
        outputs = (x,)
        if return_attention_scores:
            outputs += (weights,)
        if cached:
            outputs += (new_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, x_shape, memory_shape=None):
        return tuple(x_shape)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      activation_dropout=self.activation_dropout, norm_first=self.norm_first,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


def _unpack(out, with_weights, with_cache):
    """(x[, weights][, cache]) -> (x, weights or None, cache or None)."""
    if not isinstance(out, tuple):
        return out, None, None
    out = list(out)
    x = out.pop(0)
    weights = out.pop(0) if with_weights else None
    cache = out.pop(0) if with_cache else None
    return x, weights, cache


@keras.saving.register_keras_serializable(package="tfxformer")
class Decoder(keras.layers.Layer):
    """A stack of `num_layers` identical decoder layers (§3.1: "N = 6"), with a cache.

    Takes embedded target inputs (shifted right, plus positional encoding). With
    `norm_first=True` a final LayerNorm follows the stack.

    Args: `num_layers` and those of :class:`DecoderLayer`.

    Call arguments:
        x: (B, T, D); memory: (B, S, D) or None with a cache; memory_padding_mask: (B, S);
        cache / cache_index: a list of per-layer caches from :meth:`init_cache` and the
        position of x[:, 0]; append_cache: the caches grow (made with max_length=None);
        return_attention_scores: also return a list of per-layer
        {"self", "cross"} weights.

    Returns:
        (B, T, D); then the weights if asked; then the updated cache if one was given.

    Example:
    >>> dec = Decoder(2, d_model=8, num_heads=2, d_ff=16)
    >>> dec(tf.zeros((2, 3, 8)), tf.zeros((2, 5, 8))).shape
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
        stack = [DecoderLayer(name=f"layer_{i}", dtype=self.dtype_policy,
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

    def build(self, x_shape, memory_shape=None):
        for layer in self.stack:
            layer.build(x_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        self.built = True

    def init_cache(self, memory, max_length=None, batch_size=None):
        """Per-layer caches for decoding up to `max_length` tokens against `memory` (B, S, D).

        Self-attention slots start as zeros (B, H, max_length, K), or empty (B, H, 0, K)
        with `max_length=None`: a cache that grows, for `append_cache=True` calls. The
        memory's keys/values are projected once here, not at every step. `batch_size`
        (default B) sizes the self-attention slots, e.g. B·beam for beam search, whose
        beams share the memory's projection (see MultiHeadAttention's cache).
        """
        batch = tf.shape(memory)[0] if batch_size is None else batch_size
        heads = self.layer_kwargs["num_heads"]
        head_dim = self.layer_kwargs["d_model"] // heads
        slots = 0 if max_length is None else max_length
        zeros = tf.zeros([batch, heads, slots, head_dim], self.compute_dtype)
        memory = tf.cast(memory, self.compute_dtype)
        return [{"self": {"key": zeros, "value": zeros},
                 "cross": layer.cross_attention.project_key_value(memory)}
                for layer in self.stack]

    def call(self, x, memory=None, memory_padding_mask=None, cache=None, cache_index=None,
             append_cache=False, return_attention_scores=False, training=None):
        all_weights, new_cache = [], []
        for i, layer in enumerate(self.stack):
            out = layer(x, memory, memory_padding_mask=memory_padding_mask,
                        cache=None if cache is None else cache[i], cache_index=cache_index,
                        append_cache=append_cache,
                        return_attention_scores=return_attention_scores, training=training)
            x, weights, layer_cache = _unpack(out, return_attention_scores, cache is not None)
            all_weights.append(weights)
            new_cache.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        outputs = (x,)
        if return_attention_scores:
            outputs += (all_weights,)
        if cache is not None:
            outputs += (new_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_shape(self, x_shape, memory_shape=None):
        return tuple(x_shape)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_kwargs)
        return config
