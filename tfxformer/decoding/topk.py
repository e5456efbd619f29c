"""Exact top-k over long rows in two passes: the maxima of fixed chunks, then the few
chunks that can hold the k largest.

A beam search step takes the 2·K best of the K·V one-token extensions of each sentence
(32,000 values per sentence at K = 4, V = 8,000). `tf.math.top_k` on a CPU walks every
value through a selection heap, and at d_model 128 that was a quarter of a step's time.
The k largest values of a row lie in at most k chunks, each of which has a maximum among
the k largest chunk maxima; so :func:`top_k` reduces each chunk of `chunk` consecutive
values to its maximum (one vectorized pass), takes the k chunks with the largest maxima,
and runs `tf.math.top_k` on their k·chunk values only.

The result is `tf.math.top_k(x, k)`'s, values and indices, ties included: TopK puts the
lower index first among equal values; the chosen chunks are read in ascending order, so
positions among the gathered values follow the row's indices, and ties between chunk
maxima also go to the lower chunk. (If t is the k-th largest value, every chunk that
holds a value above t is chosen, and the chunks whose maximum equals t are chosen lowest
first, which are the ones that hold the lowest-indexed values equal to t.)
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer import checks

# Values per chunk: 64 floats are four AVX-512 vectors; the second pass reads k·64.
CHUNK = 64
# Below this many values per row (in units of k·chunk) the plain TopK is as fast.
_MIN_CHUNKS_PER_K = 4


def top_k(x, k, chunk=CHUNK):
    """The k largest values of each row of `x` (R, n), best first, and their indices:
    `(values (R, k), indices (R, k) int32)`, equal to `tf.math.top_k(x, k)`'s.

    `k` is a Python int >= 1 or a scalar int32 tensor (a traced beam size). Rows shorter
    than 4·k·chunk values go to `tf.math.top_k` itself (decided at trace time when n and k
    are static, by a `tf.cond` otherwise). Graph- and XLA-safe for a Python int `k`.
    """
    if not tf.is_tensor(k):
        k = checks.integer(k, "k", 1)
    chunk = checks.integer(chunk, "chunk", 1)
    x = tf.convert_to_tensor(x)
    if x.shape.rank != 2:
        raise ValueError(f"`x` must be (rows, n), got shape {x.shape}.")
    n, least = x.shape[1], _MIN_CHUNKS_PER_K * k * chunk
    if n is not None and not tf.is_tensor(k):
        return tuple(tf.math.top_k(x, k)) if n < least else _chunked(x, k, chunk)
    return tf.cond(tf.shape(x)[1] < least, lambda: tuple(tf.math.top_k(x, k)),
                   lambda: _chunked(x, k, chunk))


def _chunked(x, k, chunk):
    n = x.shape[1]
    if n is None or n % chunk:  # -inf after the row: never above a real value
        extra = -tf.shape(x)[1] % chunk
        x = tf.pad(x, [[0, 0], [0, extra]], constant_values=float("-inf"))
    rows = tf.shape(x)[0]
    chunks = tf.reshape(x, [rows, -1, chunk])  # (R, n / chunk, chunk)
    best = tf.sort(tf.math.top_k(tf.reduce_max(chunks, axis=-1), k).indices, axis=-1)
    candidates = tf.reshape(tf.gather(chunks, best, batch_dims=1), [rows, k * chunk])
    values, at = tf.math.top_k(candidates, k)
    return values, tf.gather(best, at // chunk, batch_dims=1) * chunk + at % chunk
