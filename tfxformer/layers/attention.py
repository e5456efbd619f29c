"""Scaled dot-product and multi-head attention (§3.2.1, §3.2.2)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.layers.ops import matmul_last

# Logit given to illegal connections before the softmax. The softmax runs in float32,
# where -1e9 is finite; it is never cast to float16/bfloat16, so it cannot become -inf.
MASKED_LOGIT = -1e9


def _validate_mask(mask, name: str, rank: int, expected: str):
    if mask is None:
        return None
    if mask.dtype != tf.bool:
        raise ValueError(f"`{name}` must be a bool tensor (True = may attend), got {mask.dtype}.")
    if mask.shape.rank is not None and mask.shape.rank != rank:
        raise ValueError(f"`{name}` must have shape {expected}, got shape {mask.shape}.")
    return mask


@keras.saving.register_keras_serializable(package="tfxformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (§3.2.1–3.2.2).

    "Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V" (Eq. 1), computed in `num_heads`
    heads of size d_k = d_v = d_model / h, concatenated and projected by W_O:
    "MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O" (§3.2.2).

    Masks are bool, True = may attend. Illegal connections get a logit of -1e9 before a
    float32 softmax ("setting to −∞ all values in the input of the softmax", §3.2.3),
    so the result stays finite under float16/bfloat16 mixed precision, and a fully
    masked row gives uniform weights instead of NaN.

    Departures from the paper (options, off by default): dropout on the attention
    weights (`dropout`), as in tensor2tensor.

    Args:
        num_heads: h, the number of heads.
        d_model: model width D; inferred from the query at build time when None. Must
            be divisible by `num_heads`.
        dropout: dropout rate on the attention weights (default 0, as in the paper).
        use_bias: whether the Q, K, V and output projections have biases.
        window: r for restricted self-attention (§4, Table 1: "considering only a
            neighborhood of size r in the input sequence centered around the respective
            output position"): query i attends keys j with |i - j| <= r (query t at
            position cache_index + t when decoding with a cache). None = full attention.
            Without a cache, mask or returned weights it runs in O(r·n·d): the sequence is
            cut into blocks of r queries, each scoring only its 3r neighbouring keys.

    Call arguments:
        query: (B, T, D).
        value: (B, S, D); keys and values are projected from it (and from `key` if given).
        key: optional (B, S, D), defaults to `value`.
        padding_mask: optional (B, S) bool, True for real key positions.
        attention_mask: optional (B or 1, T or 1, S) bool, True where query t may attend
            key s (e.g. a causal mask).
        cache: optional dict {"key": (B, H, L, K), "value": (B, H, L, K)} of projected
            keys and values. With `cache_index` (a scalar) the keys/values projected from
            `value` are written into the cache at positions [cache_index, cache_index + S)
            and attention runs over all L cached positions (incremental self-attention;
            mask the unwritten ones); with `append_cache=True` they are appended instead
            (a cache that grows by S positions per call, L = cache_index so far). Without
            `cache_index` the cache is used as is and `value` is ignored (cross-attention
            over a precomputed memory); the query batch may then be a multiple R of the
            cache's (R consecutive query rows per cache row, e.g. the beams of a
            sentence), and `padding_mask` has the cache's batch.
        append_cache: grow the cache by concatenation rather than writing into its
            fixed slots (cheaper without XLA; XLA needs the fixed-size cache).
        return_attention_scores: also return the (B, H, T, S) attention weights.

    Returns:
        (B, T, D) output; then the weights if `return_attention_scores`; then the new
        cache if `cache` was given (as a tuple when more than one is returned).

    Example:
    >>> mha = MultiHeadAttention(num_heads=2)
    >>> x = tf.random.normal((3, 5, 8))
    >>> mha(x, x, padding_mask=tf.ones((3, 5), bool)).shape
    TensorShape([3, 5, 8])
    """

    def __init__(self, num_heads, d_model=None, dropout=0.0, use_bias=True, window=None,
                 **kwargs):
        super().__init__(**kwargs)
        if int(num_heads) < 1:
            raise ValueError(f"`num_heads` must be a positive integer, got {num_heads}.")
        if window is not None and (isinstance(window, bool) or int(window) != window
                                   or window < 1):
            raise ValueError(f"`window` (restricted attention r) must be an integer >= 1 or "
                             f"None, got {window!r}.")
        self.window = None if window is None else int(window)
        self.num_heads = int(num_heads)
        self.d_model = None if d_model is None else int(d_model)
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        d_model = self.d_model or int(query_shape[-1])
        if d_model % self.num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}."
            )
        self.d_model = d_model
        self.head_dim = d_model // self.num_heads
        init = keras.initializers.GlorotUniform()
        for name in ("query", "key", "value", "output"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=(d_model, d_model), initializer=init))
            if self.use_bias:
                setattr(self, f"{name}_bias", self.add_weight(
                    name=f"{name}_bias", shape=(d_model,), initializer="zeros"))
        self.built = True

    def _project(self, x, name):
        y = matmul_last(x, tf.cast(getattr(self, f"{name}_kernel"), x.dtype))
        if self.use_bias:
            y = y + tf.cast(getattr(self, f"{name}_bias"), x.dtype)
        return y

    def _split_heads(self, x):  # (B, T, D) -> (B, H, T, K)
        shape = tf.shape(x)
        x = tf.reshape(x, [shape[0], shape[1], self.num_heads, self.head_dim])
        return tf.transpose(x, [0, 2, 1, 3])

    def project_key_value(self, value, key=None):
        """Projects a memory once into the {"key", "value"} cache used by cross-attention."""
        key = value if key is None else key
        return {
            "key": self._split_heads(self._project(key, "key")),
            "value": self._split_heads(self._project(value, "value")),
        }

    def call(self, query, value, key=None, padding_mask=None, attention_mask=None,
             cache=None, cache_index=None, append_cache=False, return_attention_scores=False,
             training=None):
        padding_mask = _validate_mask(padding_mask, "padding_mask", 2, "(B, S)")
        attention_mask = _validate_mask(attention_mask, "attention_mask", 3, "(B, T, S)")
        query_shape = tf.shape(query)
        if self.window is not None:
            if cache is None and attention_mask is None and not return_attention_scores:
                return self._restricted_blocked(query, value, key, padding_mask, training)
            attention_mask = _and(attention_mask, self._band(query_shape[1], value, cache,
                                                             cache_index, append_cache))
        q = self._project(query, "query")
        # A fixed cache (cross-attention memory) may serve R query rows per cache row (the
        # beams of a sentence): fold them into the query axis, (B*R, T, D) -> (B, R*T, D),
        # so the memory is multiplied once per sentence, not once per beam.
        fold = cache is not None and cache_index is None and attention_mask is None
        if fold:
            q = tf.reshape(q, [tf.shape(cache["key"])[0], -1, self.d_model])
        q = self._split_heads(q)  # (B, H, T, K)
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        if cache is None:
            kv = self.project_key_value(value, key)
        elif cache_index is None:
            kv = cache
        else:
            new = self.project_key_value(value, key)
            update = _append if append_cache else _write
            kv = {name: update(cache[name], new[name], cache_index) for name in ("key", "value")}
        k = tf.cast(kv["key"], q.dtype)
        v = tf.cast(kv["value"], q.dtype)

        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)  # (B, H, T, S)
        mask = _combine(padding_mask, attention_mask)
        if mask is not None:
            scores = tf.where(mask[:, None, :, :], scores, MASKED_LOGIT)
        weights = tf.nn.softmax(scores, axis=-1)
        dropped = self.attention_dropout(weights, training=training)
        context = tf.matmul(tf.cast(dropped, v.dtype), v)  # (B, H, T, K)
        context = tf.transpose(context, [0, 2, 1, 3])
        context = tf.reshape(context, [query_shape[0], query_shape[1], self.d_model])
        output = self._project(context, "output")
        if fold and return_attention_scores:  # (B, H, R*T, S) -> (B*R, H, T, S)
            shape = tf.shape(weights)
            weights = tf.reshape(weights, [shape[0], shape[1], -1, query_shape[1], shape[3]])
            weights = tf.reshape(tf.transpose(weights, [0, 2, 1, 3, 4]),
                                 [query_shape[0], shape[1], query_shape[1], shape[3]])

        outputs = (output,)
        if return_attention_scores:
            outputs += (weights,)
        if cache is not None:
            outputs += (kv,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _band(self, length, value, cache, cache_index, append_cache):
        """(1, T, S) bool: |query position - key position| <= window."""
        if cache is None:
            keys = tf.shape(value)[1]
            start = 0
        else:
            keys = tf.shape(cache["key"])[2] + (length if append_cache else 0)
            start = 0 if cache_index is None else tf.cast(cache_index, tf.int32)
        queries = tf.range(length)[:, None] + start
        return (tf.abs(queries - tf.range(keys)[None, :]) <= self.window)[None]

    def _restricted_blocked(self, query, value, key, padding_mask, training):
        """Restricted self-attention in O(r·n·d): blocks of r queries, 3r keys each."""
        r = self.window
        shape = tf.shape(query)
        n = shape[1]
        blocks = (n + r - 1) // r
        extra = blocks * r - n  # pad the sequence to whole blocks
        q = self._split_heads(self._project(query, "query"))
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        kv = self.project_key_value(value, key)
        q = tf.pad(q, [[0, 0], [0, 0], [0, extra], [0, 0]])
        q = tf.reshape(q, [shape[0], self.num_heads, blocks, r, self.head_dim])

        def windows(t):  # (B, H, n, K) -> (B, H, blocks, 3r, K): keys of blocks j-1, j, j+1
            t = tf.pad(tf.cast(t, q.dtype), [[0, 0], [0, 0], [r, r + extra], [0, 0]])
            return tf.signal.frame(t, 3 * r, r, axis=2)

        k, v = windows(kv["key"]), windows(kv["value"])
        scores = tf.cast(tf.einsum("bhnqk,bhnsk->bhnqs", q, k), tf.float32)
        real = tf.ones([shape[0], n], tf.bool) if padding_mask is None else padding_mask
        real = tf.signal.frame(tf.pad(real, [[0, 0], [r, r + extra]]), 3 * r, r, axis=1)
        offsets = tf.range(3 * r)[None, :] - r - tf.range(r)[:, None]  # key - query position
        band = tf.abs(offsets) <= r  # (r, 3r)
        mask = real[:, None, :, None, :] & band[None, None, None]
        weights = tf.nn.softmax(tf.where(mask, scores, MASKED_LOGIT), axis=-1)
        dropped = self.attention_dropout(weights, training=training)
        context = tf.einsum("bhnqs,bhnsk->bhnqk", tf.cast(dropped, v.dtype), v)
        context = tf.reshape(context, [shape[0], self.num_heads, blocks * r, self.head_dim])
        context = tf.transpose(context[:, :, :n], [0, 2, 1, 3])
        context = tf.reshape(context, [shape[0], n, self.d_model])
        return self._project(context, "output")

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape)

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, d_model=self.d_model, dropout=self.dropout,
                      use_bias=self.use_bias, window=self.window)
        return config


def _and(a, b):
    return b if a is None else tf.logical_and(a, b)


def _combine(padding_mask, attention_mask):
    """(B, S) and (B, T, S) masks -> one (B|1, T|1, S) mask, or None."""
    if padding_mask is None:
        return attention_mask
    padding = padding_mask[:, None, :]
    return padding if attention_mask is None else tf.logical_and(padding, attention_mask)


def _write(cache, new, index):
    """Writes new (B, H, T, K) into cache (B, H, L, K) at positions [index, index + T).

    A select over all L positions rather than a dynamic slice update: it compiles with
    XLA inside `tf.while_loop` (a dynamic slice update needs a compile-time start there).
    """
    new = tf.cast(new, cache.dtype)
    index = tf.cast(index, tf.int32)
    offsets = tf.range(tf.shape(cache)[2]) - index  # (L,): position - index
    inside = tf.logical_and(offsets >= 0, offsets < tf.shape(new)[2])
    spread = tf.gather(new, tf.clip_by_value(offsets, 0, tf.shape(new)[2] - 1), axis=2)
    return tf.where(inside[None, None, :, None], spread, cache)


def _append(cache, new, index):
    """Appends new (B, H, T, K) to a growing cache (B, H, index, K): steps pay for the
    positions written so far, not for all L (no XLA: the shape changes every step)."""
    del index  # the cache's length is the index
    return tf.concat([cache, tf.cast(new, cache.dtype)], axis=2)
