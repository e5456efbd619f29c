"""Greedy incremental decoding on a step function (the test reference of beam search).

Shapes: B batch, B' sentences still running, L output columns, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfxformer.decoding import common
from tfxformer.decoding.common import DEFAULTS, DecodeStart
from tfxformer.decoding.ensemble import decoder
from tfxformer.decoding.sampling import Sampler, make_sampler
from tfxformer.decoding.shortlist import to_vocabulary
from tfxformer.decoding.steering import Steering, check_no_constraints, force_prefix, steer_logits
from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID


class DecodeOutput(NamedTuple):
    """Greedy result: ids (B, L) int32 ending with EOS then PAD; lengths (B,) tokens
    including the EOS; scores (B,) float32 sums of token log-probabilities."""

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor


class _GreedyState(NamedTuple):
    """The `tf.while_loop` state of :func:`greedy_search`: the running sentences' rows."""

    i: tf.Tensor  # () int32 tokens generated so far
    rows: tf.Tensor  # (B',) int32 batch position of each running sentence
    limits: tf.Tensor  # (B',) int32 output tokens allowed
    tokens: tf.Tensor  # (B',) int32 last token
    finished: tf.Tensor  # (B',) bool ended (EOS or limit)
    scores: tf.Tensor  # (B',) float32 sum of token log-probabilities
    ids: tf.Tensor  # (B', L) int32 tokens so far, PAD after the end
    cache: Any  # leaves (B', ...)
    context: Any  # leaves (B', ...)
    steering: Any = ()  # a decoding.steering.Steering of the running sentences, or ()


def greedy_search(start: DecodeStart, eos_id=EOS_ID, pad_id=PAD_ID, bos_id=BOS_ID,
                  static_cache=False, sampler: Sampler | None = None, steering=None):
    """Greedy decoding: the most probable token at every step, on a step function; with
    a `sampler`, a token drawn from the model's distribution instead.

    One `start.step_fn` call per token inside one `tf.while_loop` (graph-safe; with
    `static_cache=True` XLA-compatible). The decoder starts from `bos_id`; a sentence
    stops at `eos_id` or at its limit; PAD and BOS are never generated. Without
    `static_cache`, a finished sentence leaves the batch (see :mod:`common`).

    Args:
        start: a :class:`DecodeStart` with one hypothesis per sentence.
        eos_id: the token that ends a sentence; None: none does (run to the limits).
        pad_id: written after a sentence's end; bos_id: the first decoder input.
        static_cache: the step function keeps every shape fixed (XLA); sentences then
            stay in the batch until all are done.
        sampler: None (the argmax), or a :class:`tfxformer.decoding.sampling.Sampler`
            (:func:`~tfxformer.decoding.sampling.make_sampler`): each token is drawn
            with temperature, top-k and top-p, reproducibly per seed.
        steering: None, or a :class:`tfxformer.decoding.steering.Steering` of the B
            sentences (repetition control, a forced prefix), applied to every step's
            logits before the argmax or the draw; constraints are beam search's
            (ValueError here).

    Returns:
        :class:`DecodeOutput` with ids (B, L), lengths (B,), scores (B,); a score is the
        model's log P(Y | X) of the output (sampled or not: no temperature, no top-k).
    """
    check_no_constraints(steering, "greedy decoding and sampling")
    eos = common.check_ids(eos_id, pad_id, bos_id)
    batch = tf.shape(start.limits)[0]
    length = start.output_columns

    def body(state, out_ids, out_scores):
        logits, cache = start.step_fn(state.tokens[:, None], state.i, state.cache,
                                      state.context)
        if isinstance(state.steering, Steering):
            logits = steer_logits(logits, state.ids, state.i, state.steering)
        log_probs = common.next_token_log_probs(logits, pad_id, bos_id)  # (B', V)
        if isinstance(state.steering, Steering):
            log_probs = force_prefix(log_probs, state.i, state.steering)
        if sampler is None:
            token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        else:
            token = sampler.tokens(log_probs, state.i)
        token_log_prob = tf.gather(log_probs, token, batch_dims=1)
        token = tf.where(state.finished, pad_id, token)
        finished = state.finished | tf.equal(token, eos) | (state.i + 1 >= state.limits)
        state = state._replace(
            i=state.i + 1, tokens=token, finished=finished,
            scores=state.scores + tf.where(state.finished, 0.0, token_log_prob),
            ids=common.write_column(state.ids, state.i, token), cache=cache)
        if static_cache:
            return state, out_ids, out_scores
        return tf.cond(tf.reduce_any(finished), lambda: _leave(state, out_ids, out_scores),
                       lambda: (state, out_ids, out_scores))

    def cond(state, out_ids, out_scores):
        return (state.i < length) & ~tf.reduce_all(state.finished)

    state = _GreedyState(
        i=tf.constant(0), rows=tf.range(batch), limits=start.limits,
        tokens=tf.fill([batch], bos_id), finished=tf.zeros([batch], tf.bool),
        scores=tf.zeros([batch], tf.float32), ids=tf.fill([batch, length], pad_id),
        cache=start.cache, context=start.context,
        steering=() if steering is None else steering)
    loop = (state, tf.fill([batch, length], pad_id), tf.zeros([batch], tf.float32))
    invariants = (common.loop_invariants(state, static_cache), loop[1].shape, loop[2].shape)
    state, out_ids, out_scores = tf.while_loop(cond, body, loop, shape_invariants=invariants)
    # Sentences still in the batch (all of them with a static cache).
    out_ids = common.scatter_rows(out_ids, state.rows, state.ids)
    out_scores = common.scatter_rows(out_scores, state.rows, state.scores)
    lengths = tf.reduce_sum(tf.cast(out_ids != pad_id, tf.int32), axis=1)
    return DecodeOutput(out_ids, lengths, out_scores)


def _leave(state, out_ids, out_scores):
    """Writes the finished sentences' results at their batch positions and keeps the
    rows of the others (one gather per field)."""
    done = state.finished
    gone = common.masked(state.rows, done)
    out_ids = common.scatter_rows(out_ids, gone, common.masked(state.ids, done))
    out_scores = common.scatter_rows(out_scores, gone, common.masked(state.scores, done))
    keep = common.running(done)
    fields = {name: common.gather_rows(value, keep)
              for name, value in state._asdict().items() if name != "i"}
    return _GreedyState(i=state.i, **fields), out_ids, out_scores


def greedy_decode(model, source_ids, extra_length=DEFAULTS.extra_length,
                  max_output_length=None, static_cache=False, *, eos_id=EOS_ID,
                  shortlist=None, sampling_topk=DEFAULTS.sampling_topk,
                  sampling_temperature=DEFAULTS.sampling_temperature,
                  sampling_topp=DEFAULTS.sampling_topp, seed=None, steering=None):
    """Greedy decoding of a Transformer with its key/value cache (§6.1 limits), or
    sampling (`sampling_topk` != 1: :mod:`tfxformer.decoding.sampling`).

    A sentence stops at EOS or at its length limit (source length + `extra_length`, at
    most the model's positions and `max_output_length`, §6.1); the loop stops when every
    sentence has; finished sentences leave the batch (unless `static_cache`). Equal to
    beam search with beam 1 and α = 0.

    Args:
        model: a :class:`tfxformer.Transformer`, or a list or tuple of them sharing a
            vocabulary: an ensemble, the argmax of its averaged probabilities
            (:mod:`tfxformer.decoding.ensemble`; a list of one is that model).
        source_ids: (B, S) int ids, PAD 0, each row ending with EOS.
        extra_length: output tokens allowed beyond the source length (default 50).
        max_output_length: optional lower cap on output tokens than the model's positions.
        static_cache: keep the self-attention cache at its full length L and write each
            step into its slot (needed under XLA, `jit_compile=True`); by default the
            cache grows by one position per step, so step i costs i positions, not L.
        eos_id: the end token (default EOS 3); None: no token ends a sentence (each runs
            to its limit, as benchmarks want).
        shortlist: None (the full vocabulary), or (V',) sorted vocabulary ids starting
            with the specials 0..3 (:func:`tfxformer.decoding.shortlist.shortlist_ids`):
            the argmax over those tokens only; the output ids are vocabulary ids.
        sampling_topk: 1 (default): the argmax; K > 1: each token drawn from the K most
            probable; 0: from the whole vocabulary (an ensemble's: from its averaged
            probabilities). Python numbers or scalar tensors, as the next two.
        sampling_temperature: divides the log-probabilities before sampling (> 0; 1.0).
        sampling_topp: keeps the most probable tokens up to this mass (in (0, 1]; 1.0).
        seed: with sampling, required: an int or integer scalar tensor (or a (2,)
            stateless key); the same seed and `source_ids` give the same tokens.
        steering: None, or a :class:`tfxformer.decoding.steering.Steering` of the B
            sentences (:func:`tfxformer.decoding.steering.make_steering`).

    Returns:
        :class:`DecodeOutput` with ids (B, L), lengths (B,), scores (B,) (log P(Y | X)).

    Raises:
        ValueError: a bad sampling option, or sampling without a seed.
    """
    sampler = make_sampler(sampling_topk, sampling_temperature, sampling_topp, seed)
    shortlist = common.shortlist_tensor(shortlist, eos_id)
    start = decoder(model, source_ids, 1, extra_length, max_output_length, static_cache,
                    shortlist)
    out = greedy_search(start, eos_id=eos_id, static_cache=static_cache, sampler=sampler,
                        steering=steering)
    if shortlist is None:
        return out
    return out._replace(ids=to_vocabulary(out.ids, shortlist))

