"""The decoding step on one token per row, with the weights read once per search.

`Transformer.decode_step` runs the Keras layers on (N, t, D) inputs for any t: every
matmul folds its rows with reshapes built from the runtime shape, every layer reads and
casts its variables, the positional encoding is computed afresh and the self-attention
mask of the growing cache is built and applied, at every step. A search's step has t = 1
and a cache that holds exactly the positions written so far, so none of that is needed:
this module reads (and casts to the compute dtype) every weight once, before the search's
loop, computes the position rows of the L output columns once, and runs the step on 2-D
(N, D) rows, where a projection is one MatMul and a head split one Reshape, and the
tied output projection one 2-D MatMul against a kernel transposed once
(:func:`output_projection`). The arithmetic is the layers' own, op for op
(:func:`tfxformer.layers.norm.layer_norm`,
:func:`tfxformer.layers.attention.attention_weights`); only the output projection sums
its products in another order, so the logits are those of `decode_step` to float32
rounding (~1e-6; bfloat16 rounding under mixed bfloat16) (tests/test_lean_step.py;
`bench/ab_translate.py --patch layer_step` compares translations).

It reads the Transformer's layers, so it lives with the model:
:meth:`tfxformer.Transformer.lean_step` returns a :class:`LeanStep` when
:func:`unsupported` finds nothing in the model it does not cover (a quantized layer,
restricted attention), else None; :func:`tfxformer.decoding.adapter.transformer_decoder`
takes it for a growing cache and `decode_step` otherwise.

Shapes: B' sentences, R beams, N = B'·R rows, H heads, K head width, D model width,
S source length, L output columns.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.layers.attention import attention_weights
from tfxformer.layers.norm import layer_norm
from tfxformer.layers.position import sinusoidal_encoding


class _Norm(NamedTuple):
    gamma: tf.Tensor
    beta: tf.Tensor
    epsilon: float


class _Affine(NamedTuple):
    kernel: tf.Tensor  # (D_in, D_out), in the compute dtype
    bias: tf.Tensor  # (D_out,)


class _Layer(NamedTuple):
    """One decoder layer's weights: affine maps by name, norms by residual block."""

    affine: dict  # self_{query,key,value,output}, cross_{query,output}, inner, outer
    norms: dict  # self, cross, feed_forward (the residual blocks' LayerNorms)


def unsupported(model) -> str | None:
    """Why the lean step cannot run the decoder layers of `model` (a
    :class:`tfxformer.Transformer`; a sentence), or None when it can."""
    for layer in model.decoder.stack:
        if layer.self_attention.window is not None:
            return "restricted self-attention (window)"
        for dense in (layer.feed_forward.inner, layer.feed_forward.outer):
            if dense.quantization_mode is not None:
                return f"a quantized layer ({dense.path})"
        attentions = (layer.self_attention, layer.cross_attention)
        if not all(attention.use_bias for attention in attentions):
            return "attention without biases"
    return None


def _affine(kernel, bias, dtype):
    return _Affine(tf.cast(kernel, dtype), tf.cast(bias, dtype))


def _norm(layer):
    return _Norm(tf.convert_to_tensor(layer.gamma), tf.convert_to_tensor(layer.beta),
                 layer.epsilon)


def _read_layer(layer, dtype):
    affine = {}
    # The memory's cross-attention keys and values are projected once (init_cache).
    projections = [("self", name) for name in ("query", "key", "value", "output")]
    for prefix, name in projections + [("cross", "query"), ("cross", "output")]:
        attention = getattr(layer, f"{prefix}_attention")
        affine[f"{prefix}_{name}"] = _affine(getattr(attention, f"{name}_kernel"),
                                             getattr(attention, f"{name}_bias"), dtype)
    for name in ("inner", "outer"):
        dense = getattr(layer.feed_forward, name)
        affine[name] = _affine(dense.kernel, dense.bias, dtype)
    norms = {"self": _norm(layer.self_attention_block.norm),
             "cross": _norm(layer.cross_attention_block.norm),
             "feed_forward": _norm(layer.feed_forward_block.norm)}
    return _Layer(affine, norms)


def output_projection(rows, dtype):
    """The tied output projection of a search: `x` (N, D) -> (N, V') float32 logits over
    `rows` (V', D) of the shared embedding (§3.4), as one 2-D MatMul against a (D, V')
    kernel transposed once, here, before the search's loop.

    Not `tf.matmul(x[:, None, :], rows, transpose_b=True)`: where TensorFlow runs Eigen
    (CPUs without AVX-512, or `TF_ENABLE_ONEDNN_OPTS=0`) that broadcast batched matmul
    is one matrix-vector product per row, reading the whole (V', D) table N times."""
    kernel = tf.transpose(tf.cast(rows, dtype))  # (D, V')
    return lambda x: tf.cast(tf.matmul(x, kernel), tf.float32)


class LeanStep:
    """The step function of a search on `model`, weights read when it is built.

    Build it outside the search's loop (its tensors are then loop inputs, read once):
    `LeanStep(model, columns, logit_rows=None)`, then `step(ids, index, self_cache,
    memory, cross_mask, beams)` -> ((N, 1, V) float32 logits, new self cache).
    `logit_rows` (V', D): the rows of the shared embedding the logits are over (a
    vocabulary shortlist, :mod:`tfxformer.decoding.shortlist`), or None (all of them).
    """

    def __init__(self, model, columns, logit_rows=None):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"The lean decoding step does not cover {reason}; use "
                             "`model.decode_step`.")
        config = model.model_config
        self.dtype = model.compute_dtype
        self.width, self.heads = config.d_model, config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.norm_first = config.norm_first
        self.embeddings = tf.convert_to_tensor(model.embedding.embeddings)  # float32
        # The layers' calls read their tables autocast to the compute dtype (Keras).
        self.input_embeddings = tf.cast(self.embeddings, self.dtype)
        self.project = output_projection(
            self.embeddings if logit_rows is None else logit_rows, self.dtype)
        if model.position.kind == "sinusoidal":
            self.positions = sinusoidal_encoding(tf.range(columns), config.d_model)
        else:
            self.positions = tf.cast(model.position.position_embeddings, self.dtype)
        self.layers = [_read_layer(layer, self.dtype) for layer in model.decoder.stack]
        final = model.decoder.final_norm
        self.final_norm = None if final is None else _norm(final)

    def __call__(self, ids, index, self_cache, memory, cross_mask, beams):
        """ids (N, 1) at position `index`; self_cache per layer {"key", "value"}
        (N, H, index, K); memory per layer {"key", "value"} (B', H, S, K); cross_mask
        (B', 1, 1, S) bool."""
        x = tf.gather(self.input_embeddings, tf.reshape(ids, [-1])) * self.width ** 0.5
        x = x + tf.cast(tf.gather(self.positions, index), self.dtype)  # (N, D)
        new_cache = []
        for layer, cache, kv in zip(self.layers, self_cache, memory, strict=True):
            x, cache = self._layer(layer, x, cache, kv, cross_mask, beams)
            new_cache.append(cache)
        if self.final_norm is not None:
            x = self._normed(x, self.final_norm)
        return self.project(x)[:, None, :], new_cache

    def _layer(self, layer, x, cache, kv, cross_mask, beams):
        affine, norms = layer.affine, layer.norms
        y = self._sublayer_input(x, norms["self"])
        out, cache = self._self_attention(affine, y, cache)
        x = self._combine(x, out, norms["self"])
        y = self._sublayer_input(x, norms["cross"])
        out = self._cross_attention(affine, y, kv, cross_mask, beams)
        x = self._combine(x, out, norms["cross"])
        y = self._sublayer_input(x, norms["feed_forward"])
        hidden = tf.nn.relu(self._apply(y, affine["inner"]))
        return self._combine(x, self._apply(hidden, affine["outer"]), norms["feed_forward"]), \
            cache

    def _self_attention(self, affine, y, cache):
        """y (N, D) -> ((N, D), the cache with this position appended). Every cached
        position is visible (the cache holds positions 0 .. index), so no mask."""
        heads = [-1, self.heads, 1, self.head_dim]  # (N, D) -> (N, H, 1, K): T = 1
        q = tf.reshape(self._apply(y, affine["self_query"]), heads)
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        cache = {name: tf.concat([cache[name], tf.reshape(
                     self._apply(y, affine[f"self_{name}"]), heads)], axis=2)
                 for name in ("key", "value")}
        weights = attention_weights(q, cache["key"])  # (N, H, 1, index + 1)
        context = tf.matmul(tf.cast(weights, q.dtype), tf.cast(cache["value"], q.dtype))
        return self._apply(tf.reshape(context, [-1, self.width]), affine["self_output"]), cache

    def _cross_attention(self, affine, y, kv, cross_mask, beams):
        """y (N, D) against the memory (B', H, S, K): the R beams of a sentence are its
        query rows, so the memory is read once per sentence."""
        q = tf.reshape(self._apply(y, affine["cross_query"]),
                       [-1, beams, self.heads, self.head_dim])
        q = tf.transpose(q, [0, 2, 1, 3])  # (B', H, R, K)
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        weights = attention_weights(q, kv["key"], cross_mask)  # (B', H, R, S)
        context = tf.matmul(tf.cast(weights, q.dtype), tf.cast(kv["value"], q.dtype))
        context = tf.transpose(context, [0, 2, 1, 3])  # (B', R, H, K)
        return self._apply(tf.reshape(context, [-1, self.width]), affine["cross_output"])

    def _apply(self, x, affine):
        return tf.matmul(x, affine.kernel) + affine.bias

    def _normed(self, x, norm):
        return layer_norm(x, norm.gamma, norm.beta, norm.epsilon, self.dtype)

    def _sublayer_input(self, x, norm):
        return self._normed(x, norm) if self.norm_first else x

    def _combine(self, x, out, norm):
        y = x + out
        return y if self.norm_first else self._normed(y, norm)
