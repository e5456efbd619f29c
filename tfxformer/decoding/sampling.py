"""Sampling the next token instead of taking the argmax: temperature, top-k, top-p.

Back-translation from sampled outputs trains better models than from beam outputs
(Edunov et al., 2018, "Understanding Back-Translation at Scale", §3-§5: sampling and
top-k sampling with k = 10): the greedy decoder (:func:`tfxformer.decoding.greedy_search`)
draws each token from the model's distribution, reshaped as fairseq's `--sampling
--sampling-topk --temperature` and OpenNMT-tf's `sampling_topk` / `sampling_temperature`
reshape it, in this order:

    logits = log_softmax(model logits) / temperature       (temperature > 0)
    top-k:  tokens below the k-th largest logit dropped    (k = 0: none dropped)
    top-p:  only the most probable tokens whose probabilities reach p kept
            (nucleus sampling, Holtzman et al., 2020; p = 1: none dropped)
    token ~ Categorical(softmax(logits))

The draws are stateless (`tf.random.stateless_categorical`): step t of a search with
seed s draws with the key fold_in(s, t), so a seed reproduces a search exactly (the same
source batch gives the same tokens) and the graph holds no random state. PAD and BOS are
never drawn (:func:`tfxformer.decoding.common.next_token_log_probs`).

Shapes: N rows (sentences still running), V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.config import DecodingOptions
from tfxformer.decoding.common import NEG_INF

__all__ = ["Sampler", "fold_seed", "make_sampler", "sample_tokens", "sampling_logits",
           "seed_key"]


class Sampler(NamedTuple):
    """What a sampling search draws with: `topk` () int32 (0: the whole vocabulary),
    `temperature` () float32 > 0, `topp` () float32 in (0, 1], `key` (2,) int32 stateless
    seed (:func:`seed_key`)."""

    topk: tf.Tensor
    temperature: tf.Tensor
    topp: tf.Tensor
    key: tf.Tensor

    def tokens(self, log_probs, step):
        """(N, V) log-probabilities -> (N,) int32 tokens drawn at `step` (() int32)."""
        return sample_tokens(log_probs, self, step)


def seed_key(seed):
    """A seed as a stateless key: a Python int or () integer tensor -> (2,) int32, the
    two 32-bit halves of its int64 value; a (2,) integer tensor is the key itself. int32,
    the seed type XLA compiles (StatelessMultinomial)."""
    seed = tf.convert_to_tensor(seed)
    if seed.shape.rank == 0:
        return tf.bitcast(tf.cast(seed, tf.int64), tf.int32)
    return tf.cast(tf.reshape(seed, [2]), tf.int32)


def fold_seed(key, data):
    """The (2,) int32 key of `key` with `data` (a step or chunk index) folded in."""
    return tf.random.experimental.stateless_fold_in(key, tf.cast(data, tf.int32))


def _in_range(value, valid, message):
    with tf.control_dependencies([tf.debugging.Assert(valid(value), [message, value])]):
        return tf.identity(value)


def make_sampler(topk=1, temperature=1.0, topp=1.0, seed=None):
    """The :class:`Sampler` of these options, or None for greedy (a Python `topk` of 1).

    Python values are checked as :class:`tfxformer.config.DecodingOptions` checks them
    (ValueError naming the bad one); tensors in the graph (InvalidArgumentError).

    Raises:
        ValueError: a bad option, or sampling without a `seed` (an int or integer tensor:
            the same seed gives the same samples).
    """
    tensors = [v for v in (topk, temperature, topp) if isinstance(v, (tf.Tensor, tf.Variable))]
    if not tensors:
        options = DecodingOptions(beam_size=1, sampling_topk=topk,
                                  sampling_temperature=temperature, sampling_topp=topp)
        if not options.sampling:
            return None
    if seed is None:
        raise ValueError("Sampling (`sampling_topk` != 1) needs a `seed` (an int): the same "
                         "seed and inputs give the same samples.")
    topk = _in_range(tf.cast(topk, tf.int32), lambda v: v >= 0, "`sampling_topk` must be >= 0")
    temperature = _in_range(tf.cast(temperature, tf.float32), lambda v: v > 0.0,
                            "`sampling_temperature` must be > 0")
    topp = _in_range(tf.cast(topp, tf.float32), lambda v: (v > 0.0) & (v <= 1.0),
                     "`sampling_topp` must be in (0, 1]")
    return Sampler(topk, temperature, topp, seed_key(seed))


def _top_k(logits, k):
    """`logits` with every entry below the k-th largest of its row set to NEG_INF (ties
    with the k-th are kept); k = 0 or k >= V keeps all."""
    vocab = tf.shape(logits)[-1]

    def kept():
        kth = tf.math.top_k(logits, tf.minimum(k, vocab)).values[:, -1:]  # (N, 1)
        return tf.where(logits < kth, NEG_INF, logits)

    return tf.cond((k > 0) & (k < vocab), kept, lambda: logits)


def _top_p(logits, p):
    """`logits` with only the smallest set of most probable entries whose probabilities
    sum to >= p kept per row (the most probable always); p = 1 keeps all."""
    def kept():
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
        before = tf.cumsum(tf.nn.softmax(ordered, axis=-1), axis=-1, exclusive=True)
        # the smallest logit still kept: those whose preceding mass is below p
        threshold = tf.reduce_min(tf.where(before < p, ordered, ordered[:, :1]), axis=-1,
                                  keepdims=True)
        return tf.where(logits < threshold, NEG_INF, logits)

    return tf.cond(p < 1.0, kept, lambda: logits)


def sampling_logits(log_probs, topk, temperature, topp):
    """(N, V) float32 log-probabilities -> the logits of the distribution drawn from:
    divided by `temperature`, then cut to the top `topk` (0: all), then to the nucleus of
    mass `topp`; dropped entries NEG_INF (see the module docstring)."""
    logits = tf.cast(log_probs, tf.float32) / temperature
    return _top_p(_top_k(logits, topk), topp)


def sample_tokens(log_probs, sampler: Sampler, step):
    """(N, V) log-probabilities -> (N,) int32 tokens, drawn with the key
    fold_in(sampler.key, step) (row n from its own stream of that key)."""
    logits = sampling_logits(log_probs, sampler.topk, sampler.temperature, sampler.topp)
    key = fold_seed(sampler.key, step)
    drawn = tf.random.stateless_categorical(logits, 1, seed=key, dtype=tf.int32)
    return drawn[:, 0]
