"""Small graph-safe tensor helpers shared by the layers."""

from __future__ import annotations

import tensorflow as tf


def matmul_last(x, kernel, transpose_b: bool = False):
    """Multiplies the last axis of `x` (..., D) by a 2-D `kernel`: (D, N), or (N, D) if transposed.

    `tf.matmul` of a (B, T, D) tensor by a (D, N) matrix broadcasts the matrix to a
    batched matmul, whose kernel gradient is a (B, D, N) tensor summed afterwards
    (8.4 GB per step for the base model's 32k-vocabulary projection). Folding the
    leading axes into rows makes it one 2-D GEMM, forward and backward.
    """
    if x.shape.rank == 2:
        return tf.matmul(x, kernel, transpose_b=transpose_b)
    if x.shape.rank == 3 and x.shape[1] == 1 and transpose_b:
        # One row per sequence (a decoding step): oneDNN runs the batched form of a
        # transposed kernel 1.2x faster than the 2-D one here (bench/STUDIES.md).
        return tf.matmul(x, kernel, transpose_b=True)
    # Static widths where the graph allows: a reshape by a constant [-1, D] and one back by
    # x's shape with its last entry moved from D to N, not slices and a concat of shape
    # tensors (7 graph ops instead of 20 a projection, in every training step and export).
    depth = kernel.shape[-1] if transpose_b else kernel.shape[0]
    out_dim = kernel.shape[0] if transpose_b else kernel.shape[-1]
    if depth is None or out_dim is None or x.shape.rank is None:  # widths known at run time
        shape = tf.shape(x)
        y = tf.matmul(tf.reshape(x, [-1, shape[-1]]), kernel, transpose_b=transpose_b)
        y = tf.reshape(y, tf.concat([shape[:-1], tf.shape(y)[-1:]], axis=0))
    else:
        y = tf.matmul(tf.reshape(x, [-1, depth]), kernel, transpose_b=transpose_b)
        shape = tf.shape(x)
        if out_dim != depth:
            shape += [0] * (x.shape.rank - 1) + [out_dim - depth]
        y = tf.reshape(y, shape)
    y.set_shape(x.shape[:-1].concatenate([out_dim]))
    return y
