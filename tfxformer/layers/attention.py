"""Scaled dot-product and multi-head attention (§3.2.1, §3.2.2)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer import checks
from tfxformer.layers.ops import matmul_last

# Logit given to illegal connections before the softmax. The softmax runs in float32,
# where -1e9 is finite; it is never cast to float16/bfloat16, so it cannot become -inf.
_MASKED_LOGIT = -1e9


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
            position cache_index + t in :meth:`call_cached`). None = full attention.
            Without an attention mask or returned weights it runs in O(r·n·d): the
            sequence is cut into blocks of r queries, each scoring only its 3r keys.

    Call arguments (`call`, teacher forcing; keras.layers.MultiHeadAttention's convention):
        query: (B, T, D).
        value: (B, S, D); keys and values are projected from it (and from `key` if given).
        key: optional (B, S, D), defaults to `value`.
        padding_mask: optional (B, S) bool, True for real key positions. When None, the
            Keras masks of `value` and `key` are used (`keras.layers.Embedding(
            mask_zero=True)`, `keras.layers.Masking`); the query's Keras mask is passed on
            to the output. (keras.layers.MultiHeadAttention also masks the rows of padded
            queries; here they attend as real ones do: the real rows are the same.)
        attention_mask: optional (B or 1, T or 1, S) bool, True where query t may attend
            key s (e.g. a causal mask).
        return_attention_scores: also return the (B, H, T, S) float32 attention weights.

    Returns:
        `call`: (B, T, D), or `(output, weights)` with `return_attention_scores=True`.
        :meth:`call_cached`: always `(output, cache)`.

    Example:
    >>> import tensorflow as tf
    >>> mha = MultiHeadAttention(num_heads=2)
    >>> x = tf.random.normal((3, 5, 8))
    >>> mha(x, x, padding_mask=tf.ones((3, 5), bool)).shape
    TensorShape([3, 5, 8])
    >>> out, weights = mha(x, x, return_attention_scores=True)
    >>> weights.shape
    TensorShape([3, 2, 5, 5])
    """

    def __init__(self, num_heads, d_model=None, dropout=0.0, use_bias=True, window=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.window = checks.integer(window, "window", 1, allow_none=True)  # restricted r
        self.num_heads = checks.integer(num_heads, "num_heads", 1)
        self.d_model = None if d_model is None else int(d_model)  # the argument, as given
        self.dropout = float(dropout)
        self.use_bias = bool(use_bias)
        self.attention_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        width = self.d_model or int(query_shape[-1])
        if width % self.num_heads:
            raise ValueError(
                f"d_model={width} is not divisible by num_heads={self.num_heads}."
            )
        self.width = width  # D in use (the config keeps the argument, None = inferred)
        self.head_dim = width // self.num_heads
        init = keras.initializers.GlorotUniform()
        for name in ("query", "key", "value", "output"):
            setattr(self, f"{name}_kernel", self.add_weight(
                name=f"{name}_kernel", shape=(width, width), initializer=init))
            if self.use_bias:
                setattr(self, f"{name}_bias", self.add_weight(
                    name=f"{name}_bias", shape=(width,), initializer="zeros"))
        self.built = True

    def _project(self, x, name):
        y = matmul_last(x, tf.cast(getattr(self, f"{name}_kernel"), x.dtype))
        if self.use_bias:
            y = y + tf.cast(getattr(self, f"{name}_bias"), x.dtype)
        return y

    def _split_heads(self, x):  # (B, T, D) -> (B, H, T, K)
        batch, length, _ = tf.unstack(tf.shape(x), num=3)  # one op for both, not two slices
        x = tf.reshape(x, tf.stack([batch, length, self.num_heads, self.head_dim]))
        return tf.transpose(x, [0, 2, 1, 3])

    def _queries(self, query):  # (B, T, D) -> (B, H, T, K), scaled by 1 / sqrt(d_k)
        q = self._split_heads(self._project(query, "query"))
        return q * tf.cast(self.head_dim ** -0.5, q.dtype)

    def project_key_value(self, value, key=None):
        """Projects a memory once into the {"key", "value"} cache used by cross-attention."""
        key = value if key is None else key
        return {
            "key": self._split_heads(self._project(key, "key")),
            "value": self._split_heads(self._project(value, "value")),
        }

    def call(self, query, value, key=None, padding_mask=None, attention_mask=None,
             return_attention_scores=False, training=None, query_mask=None, value_mask=None,
             key_mask=None):
        del query_mask  # passed on to the output by `compute_mask`, as Keras does
        if padding_mask is None:
            padding_mask = _and(_as_bool(value_mask), None if key is None or key is value
                                else _as_bool(key_mask))
        padding_mask = _validate_mask(padding_mask, "padding_mask", 2, "(B, S)")
        attention_mask = _validate_mask(attention_mask, "attention_mask", 3, "(B, T, S)")
        if self.window is not None:
            if attention_mask is None and not return_attention_scores:
                return self._restricted_blocked(query, value, key, padding_mask, training)
            attention_mask = _and(attention_mask, self._band(tf.shape(query)[1],
                                                             tf.shape(value)[1], 0))
        output, weights = self._attend(self._queries(query), self.project_key_value(value, key),
                                       _combine(padding_mask, attention_mask), tf.shape(query),
                                       training)
        return (output, weights) if return_attention_scores else output

    def call_cached(self, query, cache, cache_index=None, value=None, padding_mask=None,
                    attention_mask=None, static_cache=True, beams=1, training=None):
        """Attention over a key/value cache (incremental decoding); returns `(output, cache)`.

        Args:
            query: (N, T, D).
            cache: {"key": (B, H, L, K), "value": (B, H, L, K)} projected keys and values.
            cache_index: with a scalar position, the keys/values projected from `value`
                (default `query`: self-attention) are written into the cache at
                [cache_index, cache_index + T) (with `static_cache=False` appended instead:
                a cache that grows by T positions a call) and attention runs over all L positions
                (mask the unwritten ones). With None the cache is used as is and returned
                unchanged (cross-attention over a memory projected once by
                :meth:`project_key_value`), as keras-hub's CachedMultiHeadAttention.
            padding_mask: optional (B, S) bool, with the cache's batch.
            attention_mask: optional (N, T, L) bool.
            beams: query rows per cache row with a fixed cache, N = B * beams: row
                b * beams + k is hypothesis k of sentence b, and the memory is multiplied
                once per sentence, not once per beam. 1 (default) for N = B.
        """
        query = tf.cast(query, self.compute_dtype)  # as __call__ would (this is a method)
        value = None if value is None else tf.cast(value, self.compute_dtype)
        if not self.built:
            self.build(query.shape)
        padding_mask = _validate_mask(padding_mask, "padding_mask", 2, "(B, S)")
        attention_mask = _validate_mask(attention_mask, "attention_mask", 3, "(N, T, L)")
        shape = tf.shape(query)
        fixed = cache_index is None
        if tf.is_tensor(beams):
            folded = True  # a scalar tensor (a traced beam size): fold; 1 folds to itself
        else:
            folded = checks.integer(beams, "beams", 1) != 1
        if fixed and value is not None:
            raise ValueError("`value` is ignored with a fixed cache (cache_index=None): the "
                             "cache is the projected memory; pass value=None.")
        if folded and not fixed:
            raise ValueError(f"`beams={beams}` shares a fixed (cross-attention) cache; a "
                             "written cache (cache_index given) has one row per query row.")
        if folded and (attention_mask is not None or self.window is not None):
            raise ValueError(f"`beams={beams}` folds the beams into the query axis, which "
                             "an `attention_mask` or a `window` would not follow.")
        if fixed:
            _check_rows(query, cache["key"], beams)
            kv = cache
        else:
            new = self.project_key_value(query if value is None else value)
            update = _write if static_cache else _append
            kv = {name: update(cache[name], new[name], cache_index) for name in ("key", "value")}
        if self.window is not None:
            start = 0 if fixed else tf.cast(cache_index, tf.int32)
            attention_mask = _and(attention_mask,
                                  self._band(shape[1], tf.shape(kv["key"])[2], start))
        q = self._project(query, "query")
        if folded:  # (B*R, T, D) -> (B, R*T, D): R beams read their sentence's memory
            q = tf.reshape(q, [tf.shape(kv["key"])[0], beams * shape[1], self.width])
        q = self._split_heads(q)
        q = q * tf.cast(self.head_dim ** -0.5, q.dtype)
        output, _ = self._attend(q, kv, _combine(padding_mask, attention_mask), shape, training)
        return output, kv

    def _attend(self, q, kv, mask, query_shape, training):
        """q (B, H, T', K) against kv (B, H, S, K) -> ((N, T, D) output, weights)."""
        v = tf.cast(kv["value"], q.dtype)
        weights = attention_weights(q, kv["key"], None if mask is None else mask[:, None])
        dropped = self.attention_dropout(weights, training=training)
        context = tf.matmul(tf.cast(dropped, v.dtype), v)  # (B, H, T', K)
        context = tf.transpose(context, [0, 2, 1, 3])
        context = tf.reshape(context, query_shape)  # (N, T, D): the query's width is D
        return self._project(context, "output"), weights

    def _band(self, queries, keys, start):
        """(1, T, S) bool: |query position - key position| <= window."""
        positions = tf.range(queries)[:, None] + start
        return (tf.abs(positions - tf.range(keys)[None, :]) <= self.window)[None]

    def _restricted_blocked(self, query, value, key, padding_mask, training):
        """Restricted self-attention in O(r·n·d): blocks of r queries, 3r keys each."""
        r = self.window
        shape = tf.shape(query)
        n = shape[1]
        blocks = (n + r - 1) // r
        extra = blocks * r - n  # pad the sequence to whole blocks
        q = self._queries(query)
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
        weights = tf.nn.softmax(tf.where(mask, scores, _MASKED_LOGIT), axis=-1)
        dropped = self.attention_dropout(weights, training=training)
        context = tf.einsum("bhnqs,bhnsk->bhnqk", tf.cast(dropped, v.dtype), v)
        context = tf.reshape(context, [shape[0], self.num_heads, blocks * r, self.head_dim])
        context = tf.transpose(context[:, :, :n], [0, 2, 1, 3])
        context = tf.reshape(context, [shape[0], n, self.width])
        return self._project(context, "output")

    def compute_mask(self, inputs, previous_mask=None):
        """The query's Keras mask is the output's (keras.layers.MultiHeadAttention's rule)."""
        return previous_mask

    def compute_output_spec(self, query, value, key=None, padding_mask=None,
                            attention_mask=None, return_attention_scores=False, training=None,
                            **masks):
        width = self.d_model or query.shape[-1]
        output = keras.KerasTensor(tuple(query.shape[:-1]) + (width,), self.compute_dtype)
        if not return_attention_scores:
            return output
        shape = (query.shape[0], self.num_heads, query.shape[1], value.shape[1])
        return output, keras.KerasTensor(shape, "float32")  # softmax runs in float32

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, d_model=self.d_model, dropout=self.dropout,
                      use_bias=self.use_bias, window=self.window)
        return config


def attention_weights(q, k, mask=None):
    """softmax(q kᵀ) in float32 (Eq. 1 with q already scaled by 1 / sqrt(d_k)): q
    (B, H, T, K), k (B, H, S, K), `mask` None or bool broadcasting to (B, H, T, S), True =
    may attend; illegal connections get the logit -1e9 (§3.2.3)."""
    scores = tf.cast(tf.matmul(q, tf.cast(k, q.dtype), transpose_b=True), tf.float32)
    if mask is not None:
        scores = tf.where(mask, scores, _MASKED_LOGIT)
    return tf.nn.softmax(scores, axis=-1)


def head_average(weights, heads=0):
    """(B, H, T, S) attention weights -> (B, T, S) float32, the mean of the first `heads`
    heads (0: all): what word alignments read, and what guided alignment supervises
    (:func:`tfxformer.losses.guided_alignment_nll`)."""
    weights = tf.cast(weights, tf.float32)
    return tf.reduce_mean(weights if not heads else weights[:, :heads], axis=1)


def _as_bool(mask):
    return None if mask is None else tf.cast(mask, tf.bool)


def _check_rows(query, cache_key, beams):
    """A fixed cache of B rows serves N = B * beams query rows (checked when shapes are known)."""
    rows, memory_rows = query.shape[0], cache_key.shape[0]
    if tf.is_tensor(beams):
        return  # the reshape that folds the beams checks it at run time
    if rows is not None and memory_rows is not None and rows != memory_rows * beams:
        raise ValueError(f"The query has {rows} rows but the fixed cache {memory_rows} with "
                         f"beams={beams}: need rows = cache rows * beams (pass `beams`, the "
                         "hypotheses per sentence, when beams share the memory).")


def _and(a, b):
    """Logical and of two masks, either of which may be None."""
    if a is None or b is None:
        return b if a is None else a
    return tf.logical_and(a, b)


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
