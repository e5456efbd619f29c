"""Pieces both decoders share: what a search starts from, option checks, next-token
log-probabilities, and the row bookkeeping that lets finished sentences leave the batch.

Functions of tensors and Python values only: this module knows no model and holds no
state. How a search calls a model's encoder and decoder (directly, or through one traced
function per model while an export traces its graphs) is
:mod:`tfxformer.decoding.model_calls`'.

A search runs on a *step function* (as flax's `decode.beam_search(..., tokens_to_logits)`
and tf-models' `SequenceBeamSearch(symbols_to_logits_fn, ...)`), not on a model::

    step_fn(ids, index, cache, context) -> (logits, cache)
        ids      (N, 1) int32   the last token of each hypothesis, N = B * beams; row
                                b * beams + k is hypothesis k of sentence b
        index    () int32       the position of `ids` (tokens generated so far)
        cache    nest, leaves (N, ...)   per-hypothesis state (self-attention keys and
                                values): the search reorders its rows as beams move
        context  nest, leaves (B, ...)   per-sentence state (encoder memory, source mask),
                                read only: never reordered, shared by a sentence's beams
        logits   (N, V) or (N, 1, V)     next-token scores

:func:`tfxformer.decoding.adapter.transformer_decoder` builds one for a Transformer.
With a vocabulary shortlist (:mod:`tfxformer.decoding.shortlist`) V is the shortlist's
length and the ids are its columns; the special ids 0..3 are the same in both.

A model adapter may also give a *prefill function* (`DecodeStart.prefill_fn`), which
decodes t given tokens of each sentence in one teacher-forced pass (the decoder reads them
at once, as in training) into the same cache: beam search forces a target prefix with it
(:mod:`tfxformer.decoding.prefill`).

Finished sentences leave the batch (as CTranslate2 does): with a growing cache, each step
gathers the rows of the sentences still running out of `cache`, `context`, the limits and
the search state, and writes the results of the finished ones into full-size outputs at
their batch positions, so a step costs what the running sentences cost. Every leaf may
then change its leading (batch) axis and any other axis but the last between steps. With
`static_cache=True` (XLA: every shape fixed) all sentences stay until the last is done.

Shapes: B batch, B' sentences still running, N rows of the step function, L longest
output (columns of the result), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.ids import BOS_ID, EOS_ID, NUM_SPECIAL_IDS, PAD_ID

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "NEG_INF", "DecodeStart"]

# Score of impossible hypotheses: finite, so sums and comparisons never give NaN.
NEG_INF = -1e9
DEFAULTS = DecodingOptions()  # beam size, α and extra length when none is given (§6.1)


class DecodeStart(NamedTuple):
    """What a search starts from (built by a model adapter; see the module docstring)."""

    step_fn: Callable  # (ids (N, 1), index (), cache, context) -> (logits, cache)
    cache: Any  # nest, leaves (B * beams, ...): per hypothesis, reordered with the beams
    context: Any  # nest, leaves (B, ...): per sentence, read only
    limits: tf.Tensor  # (B,) int32 >= 1: output tokens allowed per sentence, EOS included
    output_columns: tf.Tensor  # () int32 >= every limit: the columns L of the output ids
    # None, or (ids (B, t), index (), cache, context) -> (logits (B, t, V) float32, cache):
    # t tokens of each sentence at positions index .. index + t - 1 at once, one row per
    # sentence (cache leaves (B, ...)): a forced target prefix in one teacher-forced pass
    prefill_fn: Callable | None = None


def checked(tensor, assertion, message):
    """`tensor`, computed only after `assertion(tensor)` passed (ops in a graph need not
    run in program order otherwise)."""
    with tf.control_dependencies([assertion(tensor, message=message)]):
        return tf.identity(tensor)


def check_nonnegative_int(value, name):
    """Raises ValueError for a Python value that is not an int >= 0; a tensor gets a
    graph assertion."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return checked(value, tf.debugging.assert_non_negative, f"`{name}` must be >= 0")
    return checks.integer(value, name, 0)


def check_ids(eos_id, pad_id, bos_id):
    """Python ints >= 0 (`eos_id` may be None: no token ends a hypothesis); PAD != EOS."""
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id), ("bos_id", bos_id)):
        if value is None and name == "eos_id":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{name}` must be a token id (an int >= 0)"
                             f"{' or None' if name == 'eos_id' else ''}, got {value!r}.")
    if eos_id == pad_id:
        raise ValueError(f"`eos_id` and `pad_id` must differ (both {eos_id}): PAD marks "
                         "the columns after a hypothesis' end.")
    return -1 if eos_id is None else eos_id  # -1 equals no token


def shortlist_tensor(shortlist, eos_id):
    """A search's `shortlist`: int32 if a tensor, else a numpy array (None stays None;
    the adapter checks its ids). The search runs in the shortlist's columns, where only
    the special ids keep their value, so `eos_id` must be one of them (or None)."""
    if shortlist is None:
        return None
    if eos_id is not None and eos_id not in range(NUM_SPECIAL_IDS):
        raise ValueError(f"With a `shortlist`, `eos_id` must be a special id "
                         f"(0..{NUM_SPECIAL_IDS - 1}) or None, got {eos_id!r}: the search "
                         "runs on shortlist columns, where only those keep their id.")
    if isinstance(shortlist, (tf.Tensor, tf.Variable)):
        return tf.cast(shortlist, tf.int32)
    return np.asarray(shortlist)  # checked (with a clear error) by the adapter


def next_token_log_probs(logits, pad_id=PAD_ID, bos_id=BOS_ID):
    """(N, V) or (N, 1, V) logits -> (N, V) float32 log-probabilities; PAD and BOS are
    never generated."""
    if logits.shape.rank == 3:
        logits = logits[:, -1]
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    vocab = tf.shape(log_probs)[-1]
    forbidden = tf.reduce_any(tf.range(vocab)[:, None] == [[pad_id, bos_id]], axis=-1)
    return tf.where(forbidden[None, :], NEG_INF, log_probs)


def write_column(ids, column, values):
    """ids (..., L) with ids[..., column] = values (...); XLA-friendly (no scatter)."""
    at = tf.range(tf.shape(ids)[-1]) == column
    return tf.where(at, values[..., None], ids)


def masked(values, mask):
    """(N, ...) values, (N,) bool -> the values where `mask` is True: `tf.boolean_mask` on
    axis 0 as one gather (a third of its graph nodes)."""
    return tf.gather(values, tf.where(mask)[:, 0])


def rows_to_ragged(tensor, lengths):
    """(N, L, ...) rows and (N,) lengths -> the (N, None, ...) ragged tensor of each row's
    first `lengths` items: `tf.RaggedTensor.from_tensor(tensor, lengths=lengths)` in a
    fraction of its graph ops (one mask, no validation)."""
    lengths = tf.cast(lengths, tf.int64)
    real = tf.range(tf.shape(tensor, out_type=tf.int64)[1])[None, :] < lengths[:, None]
    return tf.RaggedTensor.from_row_lengths(tf.gather_nd(tensor, tf.where(real)), lengths,
                                            validate=False)


def followed_in_row(lengths):
    """Flat over rows of `lengths` (N,) items, (sum(lengths),) bool: the item has a next
    one in its row (False for each row's last); in a few graph ops (a ragged range and a
    roll: the next item's position in its row is 0 where a row starts)."""
    lengths = tf.cast(lengths, tf.int64)
    position = tf.raw_ops.RaggedRange(starts=tf.zeros_like(lengths), limits=lengths,
                                      deltas=tf.constant(1, tf.int64)).rt_dense_values
    return tf.not_equal(tf.roll(position, -1, axis=0), 0)


def gather_rows(tree, rows):
    """Every leaf (R, ...) of a nest -> (len(rows), ...): its rows `rows`."""
    return tf.nest.map_structure(lambda t: tf.gather(t, rows), tree)


def hypothesis_rows(sentences, beams):
    """(B',) sentence indices -> (B' * beams,) their step-function rows, b * beams + k."""
    return tf.reshape(sentences[:, None] * beams + tf.range(beams)[None, :], [-1])


def scatter_rows(full, rows, values):
    """`full` (B, ...) with full[rows[j]] = values[j]: results back at batch positions."""
    return tf.tensor_scatter_nd_update(full, rows[:, None], tf.cast(values, full.dtype))


def running(done):
    """(B',) bool done -> int32 indices of the sentences still running."""
    return tf.cast(tf.reshape(tf.where(~done), [-1]), tf.int32)


def loop_invariants(state, static_cache):
    """`tf.while_loop` shape invariants of a search state (a NamedTuple with `cache` and
    `context` fields): exact shapes with a static cache; otherwise the batch axis of
    every field may shrink and a cache leaf keeps only its last axis (as tf-models'
    `_get_shape_keep_last_dim`: a growing self-attention cache changes length too)."""
    def batch_free(t):
        shape = t.shape
        return shape if static_cache or shape.rank == 0 else tf.TensorShape(
            [None]).concatenate(shape[1:])

    def last_kept(t):
        shape = t.shape
        return shape if static_cache or shape.rank == 0 else tf.TensorShape(
            [None] * (shape.rank - 1)).concatenate(shape[-1:])

    fields = {name: tf.nest.map_structure(last_kept if name == "cache" else batch_free, value)
              for name, value in state._asdict().items()}
    return type(state)(**fields)
