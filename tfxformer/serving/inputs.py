"""A translator's request inputs: the specs of its signatures' inputs, and the checks on
them in the graph: each input takes one value per text (or one for all), in its accepted
range; a bad one fails the call with InvalidArgumentError naming it. (`translate_nbest`'s
own inputs are :mod:`tfxformer.serving.nbest_request`'s.)

Shapes: N texts.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["EXAMPLE_OPTION_SPECS", "LANGUAGE_SPEC", "OPTION_SPECS", "SAMPLING_SPECS",
           "TARGET_SPEC", "TEXT_SPEC", "checked", "example_options", "input_limits",
           "option_keys", "per_text"]

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
LANGUAGE_SPEC = tf.TensorSpec([None], tf.string, name="target_language")
OPTION_SPECS = (tf.TensorSpec([], tf.int32, name="beam_size"),
                tf.TensorSpec([], tf.float32, name="alpha"),
                tf.TensorSpec([], tf.int32, name="extra_length"))
EXAMPLE_OPTION_SPECS = (tf.TensorSpec([None], tf.int32, name="beam_size"),
                        tf.TensorSpec([None], tf.float32, name="alpha"),
                        tf.TensorSpec([None], tf.int32, name="extra_length"),
                        tf.TensorSpec([None], tf.int32, name="max_input_tokens"))
SAMPLING_SPECS = (tf.TensorSpec([], tf.int32, name="sampling_topk"),
                  tf.TensorSpec([], tf.float32, name="sampling_temperature"),
                  tf.TensorSpec([], tf.float32, name="sampling_topp"),
                  tf.TensorSpec([], tf.int32, name="extra_length"),
                  tf.TensorSpec([], tf.int64, name="seed"))
TARGET_SPEC = tf.TensorSpec([None], tf.string, name="target")

# The decoding options a text may have of its own, with their dtype, test and accepted range.
_EXAMPLE_OPTIONS = {"beam_size": (tf.int32, lambda v: v >= 1, ">= 1"),
                    "alpha": (tf.float32, lambda v: v >= 0.0, ">= 0"),
                    "extra_length": (tf.int32, lambda v: v >= 0, ">= 0")}


def checked(tensor, condition, message):
    """`tensor`, computed only after the scalar bool `condition` held (InvalidArgument)."""
    with tf.control_dependencies([tf.debugging.Assert(condition, [message])]):
        return tf.identity(tensor)


def per_text(value, size, name, dtype):
    """`value` as an (N,) `dtype` tensor with one value per text, or InvalidArgument: a
    scalar is every text's; any other shape must hold N values."""
    value = tf.cast(value, dtype)
    if value.shape.rank != 0:
        value = checked(value, tf.equal(tf.size(value), size),
                        f"`{name}` must have one value per text (shape [N] like `text`)")
    return tf.broadcast_to(value, [size])


def example_options(options, size):
    """{beam_size, alpha, extra_length} (scalars or (N,) each) -> (N,) tensors, checked:
    one per text, each in its accepted range."""
    checked_options = {}
    for name, (dtype, valid, accepted) in _EXAMPLE_OPTIONS.items():
        value = per_text(options[name], size, name, dtype)
        checked_options[name] = checked(value, tf.reduce_all(valid(value)),
                                        f"`{name}` must be {accepted} for every text")
    return checked_options


def option_keys(options):
    """(N, 3) int32 keys of (N,) {beam_size, alpha, extra_length}: texts decode alike
    where their keys are equal (α's bits: no float comparison)."""
    return tf.stack([options["beam_size"], tf.bitcast(options["alpha"], tf.int32),
                     options["extra_length"]], axis=1)


def input_limits(max_input_tokens, size, limit):
    """(N,) int32 source-token limits: `limit` (the export's), or the lower ones asked
    (`max_input_tokens`: None, a scalar or (N,); each >= 1)."""
    limits = tf.fill([size], limit)
    if max_input_tokens is None:
        return limits
    asked = per_text(max_input_tokens, size, "max_input_tokens", tf.int32)
    asked = checked(asked, tf.reduce_all(asked >= 1), "`max_input_tokens` must be >= 1")
    return tf.minimum(asked, limits)
