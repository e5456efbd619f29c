"""The decoding step of every search: one token per row, the weights read once per search.

`Transformer.decode_step` runs the Keras layers on (N, t, D) inputs for any t (training's
teacher forcing, a forced prefix in one pass): every matmul folds its rows with reshapes
built from the runtime shape, every layer reads and casts its variables, the positional
encoding is computed afresh and the self-attention mask is built and applied, at every
call. A search's step has t = 1, so none of that is needed: :class:`SearchStep` reads
(and casts to the compute dtype) every weight once, before the search's loop, computes the
position rows of the L output columns once, and runs the step on 2-D (N, D) rows, where a
projection is one MatMul (the self-attention's query, key and value one MatMul against
their kernels joined once), a head split one Reshape, and the tied output projection one
2-D MatMul against a kernel transposed once (:func:`output_projection`). The arithmetic is
the layers' own (:func:`tfxformer.layers.norm.layer_norm`,
:func:`tfxformer.layers.attention.attention_weights`); the joined projections and the
output projection sum their products in another order, so the logits are those of
`decode_step` to float32 rounding (~1e-6; bfloat16 rounding under mixed bfloat16)
(tests/test_search_step.py).

Every search runs it, with either cache:

- a *growing* cache (the graph path: finished sentences leave the batch): each step
  appends its position's keys and values, and attends over the positions written so far;
- a *static* cache of L columns (the XLA-compiled search, whose shapes are fixed): each
  step writes its position in place (a dynamic-update-slice) and attends over all L
  columns, the unwritten ones masked.

It covers every decoder the layers build: restricted self-attention (§4, a window of r
positions back), attention without biases, quantized feed-forward layers (the int8
`Dense` layers run as they are, `model.quantize("int8")`).

It reads the Transformer's layers, so it lives with the model:
:meth:`tfxformer.Transformer.search_step` builds it, and
:func:`tfxformer.decoding.adapter.transformer_decoder` takes it.

Shapes: B' sentences, R beams, N = B'·R rows, H heads, K head width, D model width,
S source length, L output columns.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as tfxla

from tfxformer.layers.attention import attention_weights
from tfxformer.layers.norm import layer_norm
from tfxformer.layers.position import sinusoidal_encoding


class _Norm(NamedTuple):
    gamma: tf.Tensor
    beta: tf.Tensor
    epsilon: float


class _Affine(NamedTuple):
    kernel: tf.Tensor  # (D_in, D_out), in the compute dtype
    bias: tf.Tensor | None  # (D_out,), or None (a layer without biases)


class _Layer(NamedTuple):
    """One decoder layer's weights: affine maps by name, norms by residual block."""

    affine: dict  # self_qkv (D, 3D), self_output, cross_query, cross_output; inner, outer
    norms: dict  # self, cross, feed_forward (the residual blocks' LayerNorms)
    window: int | None  # restricted self-attention: r positions back, or None
    dense: dict  # inner, outer: the quantized Keras layers to call, else absent


def _affine(kernel, bias, dtype):
    return _Affine(tf.cast(kernel, dtype), None if bias is None else tf.cast(bias, dtype))


def _norm(layer):
    return _Norm(tf.convert_to_tensor(layer.gamma), tf.convert_to_tensor(layer.beta),
                 layer.epsilon)


def _bias(attention, name):
    return getattr(attention, f"{name}_bias") if attention.use_bias else None


def _joined_qkv(self_attention, dtype):
    """(kernel (D, 3D), bias (3D,) or None): a self-attention's query, key and value
    projections joined into one."""
    parts = [_affine(getattr(self_attention, f"{name}_kernel"), _bias(self_attention, name),
                     dtype) for name in ("query", "key", "value")]
    return (tf.concat([p.kernel for p in parts], axis=1),
            None if parts[0].bias is None else tf.concat([p.bias for p in parts], 0))


def derived_weights(model, output_kernel=True):
    """The tensors :class:`SearchStep` computes from `model`'s variables, in its compute
    dtype: {"output_kernel": (D, V) the shared embedding transposed, "self_qkv": per
    decoder layer (kernel (D, 3D), bias (3D,) or None)}. A search computes them at every
    call unless given them (`SearchStep(..., derived=...)`): an export keeps them as
    variables of their own (:class:`tfxformer.serving.Translator`), where transposing a
    vocabulary's embedding costs a request more than a millisecond. `output_kernel=False`:
    without it (None; a search over a shortlist's rows)."""
    dtype = model.compute_dtype
    kernel = tf.transpose(tf.cast(model.embedding.embeddings, dtype)) if output_kernel else None
    return {"output_kernel": kernel,
            "self_qkv": [_joined_qkv(layer.self_attention, dtype)
                         for layer in model.decoder.stack]}


def _read_layer(layer, dtype, qkv):
    cross = layer.cross_attention
    affine = {"self_qkv": _Affine(*qkv),
              "self_output": _affine(layer.self_attention.output_kernel,
                                     _bias(layer.self_attention, "output"), dtype)}
    # The memory's cross-attention keys and values are projected once (init_cache).
    for name in ("query", "output"):
        affine[f"cross_{name}"] = _affine(getattr(cross, f"{name}_kernel"),
                                          _bias(cross, name), dtype)
    dense = {}
    for name in ("inner", "outer"):
        layer_ = getattr(layer.feed_forward, name)
        if layer_.quantization_mode is not None:
            dense[name] = layer_  # its int8 kernel and scales: the layer computes it
        else:
            affine[name] = _affine(layer_.kernel, layer_.bias, dtype)
    norms = {"self": _norm(layer.self_attention_block.norm),
             "cross": _norm(layer.cross_attention_block.norm),
             "feed_forward": _norm(layer.feed_forward_block.norm)}
    return _Layer(affine, norms, layer.self_attention.window, dense)


def output_projection(kernel):
    """The tied output projection of a search: `x` (N, D) -> (N, V') float32 logits, one
    2-D MatMul against `kernel` (D, V'): rows of the shared embedding (§3.4), transposed
    before the search's loop.

    Not `tf.matmul(x[:, None, :], rows, transpose_b=True)`: where TensorFlow runs Eigen
    (CPUs without AVX-512, or `TF_ENABLE_ONEDNN_OPTS=0`) that broadcast batched matmul
    is one matrix-vector product per row, reading the whole (V', D) table N times."""
    return lambda x: tf.cast(tf.matmul(x, kernel), tf.float32)


class SearchStep:
    """The step function of a search on `model`, weights read when it is built.

    Build it outside the search's loop (its tensors are then loop inputs, read once):
    `SearchStep(model, columns, logit_rows=None, static_cache=False, derived=None)`, then
    `step(ids, index, self_cache, memory, cross_mask, beams)` -> ((N, 1, V) float32
    logits, new self cache).

    Args:
        model: a :class:`tfxformer.Transformer`.
        columns: L, the output positions the search may reach (a scalar).
        logit_rows: (V', D) the rows of the shared embedding the logits are over (a
            vocabulary shortlist, :mod:`tfxformer.decoding.shortlist`), or None (all).
        static_cache: False: the self cache per layer {"key", "value"} (N, H, index, K)
            grows by one position a step; True: it holds L positions (N, H, L, K), each
            step writing its own in place (fixed shapes, for XLA).
        derived: :func:`derived_weights` of `model` computed beforehand (an export's
            variables), or None: computed here.
    """

    def __init__(self, model, columns, logit_rows=None, static_cache=False, derived=None):
        config = model.model_config
        self.dtype = model.compute_dtype
        self.static_cache = bool(static_cache)
        self.width, self.heads = config.d_model, config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.norm_first = config.norm_first
        self.embeddings = tf.convert_to_tensor(model.embedding.embeddings)  # float32
        # The layers' calls read their tables autocast to the compute dtype (Keras).
        self.input_embeddings = tf.cast(self.embeddings, self.dtype)
        if derived is None:
            derived = derived_weights(model, output_kernel=logit_rows is None)
        self.project = output_projection(
            derived["output_kernel"] if logit_rows is None
            else tf.transpose(tf.cast(logit_rows, self.dtype)))
        if model.position.kind == "sinusoidal":
            self.positions = sinusoidal_encoding(tf.range(columns), config.d_model)
        else:
            self.positions = tf.cast(model.position.position_embeddings, self.dtype)
        self.layers = [_read_layer(layer, self.dtype, qkv)
                       for layer, qkv in zip(model.decoder.stack, derived["self_qkv"],
                                             strict=True)]
        final = model.decoder.final_norm
        self.final_norm = None if final is None else _norm(final)

    def __call__(self, ids, index, self_cache, memory, cross_mask, beams):
        """ids (N, 1) at position `index`; self_cache per layer {"key", "value"} (see the
        class); memory per layer {"key", "value"} (B', H, S, K); cross_mask (B', 1, 1, S)
        bool."""
        index = tf.cast(index, tf.int32)
        x = tf.gather(self.input_embeddings, tf.reshape(ids, [-1])) * self.width ** 0.5
        x = x + tf.cast(tf.gather(self.positions, index), self.dtype)  # (N, D)
        # How far back each self-attention key is, once a step for every layer that masks
        # (the cache's L columns with a static cache, positions 0 .. index growing).
        back = None
        if self.static_cache or any(layer.window is not None for layer in self.layers):
            keys = tf.shape(self_cache[0]["key"])[2] + (0 if self.static_cache else 1)
            back = index - tf.range(keys)
        new_cache = []
        for layer, cache, kv in zip(self.layers, self_cache, memory, strict=True):
            x, cache = self._layer(layer, x, index, back, cache, kv, cross_mask, beams)
            new_cache.append(cache)
        if self.final_norm is not None:
            x = self._normed(x, self.final_norm)
        return self.project(x)[:, None, :], new_cache

    def _layer(self, layer, x, index, back, cache, kv, cross_mask, beams):
        norms = layer.norms
        y = self._sublayer_input(x, norms["self"])
        out, cache = self._self_attention(layer, y, index, back, cache)
        x = self._combine(x, out, norms["self"])
        y = self._sublayer_input(x, norms["cross"])
        out = self._cross_attention(layer.affine, y, kv, cross_mask, beams)
        x = self._combine(x, out, norms["cross"])
        y = self._sublayer_input(x, norms["feed_forward"])
        hidden = tf.nn.relu(self._dense(layer, "inner", y))
        out = self._dense(layer, "outer", hidden)
        return self._combine(x, out, norms["feed_forward"]), cache

    def _self_attention(self, layer, y, index, back, cache):
        """y (N, D) -> ((N, D), the cache with this position's keys and values); `back`
        (keys,) int32: how far back each key is from `index` (None: no layer masks)."""
        heads = [-1, self.heads, 1, self.head_dim]  # (N, D) -> (N, H, 1, K): T = 1
        q, k, v = tf.split(self._apply(y, layer.affine["self_qkv"]), 3, axis=-1)
        q = tf.reshape(q, heads) * tf.cast(self.head_dim ** -0.5, q.dtype)
        cache = {name: self._written(cache[name], tf.reshape(new, heads), index)
                 for name, new in (("key", k), ("value", v))}
        mask = None
        if self.static_cache or layer.window is not None:
            # positions 0 .. index (the unwritten columns of a static cache are masked),
            # and within the window r back (§4, restricted self-attention)
            mask = back >= 0
            if layer.window is not None:
                mask &= back <= layer.window
        weights = attention_weights(q, cache["key"], mask)  # (N, H, 1, keys)
        context = tf.matmul(tf.cast(weights, q.dtype), tf.cast(cache["value"], q.dtype))
        return self._apply(tf.reshape(context, [-1, self.width]),
                           layer.affine["self_output"]), cache

    def _written(self, cache, new, index):
        """The cache (N, H, ·, K) with `new` (N, H, 1, K) as position `index`."""
        new = tf.cast(new, cache.dtype)
        if not self.static_cache:
            return tf.concat([cache, new], axis=2)  # the cache holds positions 0 .. index - 1
        zero = tf.constant(0, tf.int32)
        return tfxla.dynamic_update_slice(cache, new, tf.stack([zero, zero, index, zero]))

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

    def _dense(self, layer, name, x):
        quantized = layer.dense.get(name)
        if quantized is not None:
            return tf.cast(quantized(x), self.dtype)
        return self._apply(x, layer.affine[name])

    @staticmethod
    def _apply(x, affine):
        y = tf.matmul(x, affine.kernel)
        return y if affine.bias is None else y + affine.bias

    def _normed(self, x, norm):
        return layer_norm(x, norm.gamma, norm.beta, norm.epsilon, self.dtype)

    def _sublayer_input(self, x, norm):
        return self._normed(x, norm) if self.norm_first else x

    def _combine(self, x, out, norm):
        y = x + out
        return y if self.norm_first else self._normed(y, norm)
