"""A forced target prefix in one teacher-forced pass (a *prefill*) before beam search.

While a hypothesis is inside its prefix, the search may only write the prefix's next
token (:func:`tfxformer.decoding.steering.force_prefix`): one hypothesis per sentence is
alive and its tokens are known. Forcing m tokens step by step costs m decoder steps,
each with a step's fixed cost; the decoder can instead read the m known inputs at once,
as in training (CTranslate2 decodes its target prefix so too). :func:`prefill` runs the
adapter's prefill function (`DecodeStart.prefill_fn`, the model's `decode_step` on t
tokens) once over the columns [BOS, p_0 .. p_{m-2}] of every sentence, one row per
sentence, fills the self-attention cache with positions 0 .. m-1 and repeats it for the
K beams; the search then starts at step m with p_0 .. p_{m-1} written, scored as the
step-by-step path scores them: at each position the logits steered with the history up
to it (repetition penalty, no-repeat n-gram), then the search's log-softmax with PAD and
BOS masked (:func:`tfxformer.decoding.common.next_token_log_probs`), the prefix token's
log-probability taken. The rest of a longer prefix is forced step by step as before.

m is the fewest prefix tokens in the batch (a runtime tensor), at most each sentence's
output limit less one and stopping before an EOS inside a prefix. No prefill runs when
m < :data:`MIN_COLUMNS` (one column costs what a step costs) or when the batch holds
terminology constraints (their state follows each token:
:mod:`tfxformer.decoding.constraints`); the search then runs as without it. Nor is the
pass kept when one of the m forced tokens is one the search may not write (PAD or BOS:
the step-by-step search then writes another token there).

With a growing cache the pass reads exactly the m columns; with a static cache (XLA:
every shape fixed) it reads min(P, L - 1) columns (P the prefix tensor's, L the output
columns), a width known when compiling: the slots past m hold values the search's later
steps overwrite before they read them.

Shapes: B sentences, K beams, P prefix columns, L output columns, V vocabulary, t
columns of the pass.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.decoding import common
from tfxformer.decoding.common import NEG_INF
from tfxformer.decoding.steering import Steering, has_constraints, steer_logits

__all__ = ["MIN_COLUMNS", "can_prefill", "forced_columns", "prefill"]

# The fewest forced columns worth a prefill: one column is one step either way.
MIN_COLUMNS = 2


def forced_columns(steering: Steering, limits, eos_id):
    """() int32 m: the prefix columns every sentence of the batch forces, at most its
    output limit less one (the last column must be free to end) and none from an EOS in
    its prefix on; `limits` (B,) int32."""
    prefix, lengths = steering.prefix, steering.prefix_lengths
    eos_seen = tf.cumsum(tf.cast(tf.equal(prefix, eos_id), tf.int32), axis=1)
    before_eos = tf.reduce_sum(tf.cast(eos_seen == 0, tf.int32), axis=1)  # (B,)
    return tf.reduce_min(tf.minimum(tf.minimum(lengths, before_eos), limits - 1))


def can_prefill(start, steering) -> bool:
    """Whether a prefill may run (decided when tracing): `steering` has a prefix tensor
    not known to be empty and the adapter a prefill function."""
    return isinstance(steering, Steering) and start.prefill_fn is not None \
        and steering.prefix.shape[1] != 0


def prefill(state, start, steering: Steering, beam_size, eos_id, pad_id, bos_id,
            static_cache=False):
    """`state` (a beam search's state before its first step: fields i, alive_seq (B, K,
    L + 1), alive_log_probs (B, K), cache, context, alive_token_log_probs) moved past the
    batch's m forced prefix columns by one pass (module docstring), or `state` as it is
    when no prefill runs (m < :data:`MIN_COLUMNS`, constraints in the batch) or a forced
    token is one the search may not write (PAD, BOS)."""
    m = forced_columns(steering, start.limits, eos_id)
    run = (m >= MIN_COLUMNS) & (tf.size(start.limits) > 0)
    if has_constraints(steering):
        run &= ~tf.reduce_any(tf.not_equal(steering.constraints, pad_id))
    tracks = isinstance(state.alive_token_log_probs, tf.Tensor)
    names = ["i", "alive_seq", "alive_log_probs", "cache"] + (
        ["alive_token_log_probs"] if tracks else [])

    def before():
        return [getattr(state, name) for name in names]

    def after():
        cache, token_lps, width = _pass(start, steering, m, beam_size, pad_id, bos_id,
                                        static_cache)
        forced = tf.range(width)[None, :] < m
        seq = _write_columns(state.alive_seq, steering.prefix, m)
        total = tf.reduce_sum(tf.where(forced, token_lps, 0.0), axis=1)
        # Only beam 0 is alive while a prefix is forced (the others stay NEG_INF).
        alive = tf.concat([total[:, None], state.alive_log_probs[:, 1:]], axis=1)
        values = dict(i=m, alive_seq=seq, alive_log_probs=alive, cache=cache)
        if tracks:
            values["alive_token_log_probs"] = _write_columns(state.alive_token_log_probs,
                                                             token_lps, m)
        # A forced token the search may not write (PAD or BOS): the step-by-step search
        # decides what it writes there instead.
        writable = tf.reduce_all(~forced | (token_lps > NEG_INF / 2))
        return tf.cond(writable, lambda: [values[name] for name in names], before)

    out = tf.cond(run, after, before)
    return state._replace(**dict(zip(names, out, strict=True)))


def _pass(start, steering, m, beam_size, pad_id, bos_id, static_cache):
    """(cache of the B·K hypotheses with positions 0 .. m-1, (B, t) float32 log-probability
    of each prefix token as the search scores it, t the pass' columns)."""
    prefix = steering.prefix
    batch = tf.shape(prefix)[0]
    if static_cache:  # a width known when compiling (XLA): min(P, L - 1) >= m
        width = tf.minimum(tf.shape(prefix)[1], start.output_columns - 1)
    else:
        width = m
    targets = prefix[:, :width]  # (B, t) the tokens the pass' positions predict
    ids = tf.concat([tf.fill([batch, 1], bos_id), targets[:, :-1]], axis=1)
    rows = common.gather_rows(start.cache, tf.range(batch) * beam_size)  # one per sentence
    logits, cache = start.prefill_fn(ids, tf.constant(0), rows, start.context)
    # rows b·K + k <- row b (one gather per leaf: cheaper than tf.repeat's ops)
    cache = common.gather_rows(cache, tf.range(batch * beam_size) // beam_size)
    # Position j of sentence b is row b·t + j, its history the prefix's first j tokens.
    vocab = logits.shape[-1] or tf.shape(logits)[-1]
    flat = tf.reshape(tf.cast(logits, tf.float32), [-1, vocab])  # (B·t, V)
    sentence = tf.range(batch * width) // width  # (B·t,)
    controls = steering._replace(constraints=(), constraint_continues=())
    flat = steer_logits(flat, tf.gather(prefix, sentence), tf.range(batch * width) % width,
                        common.gather_rows(controls, sentence))
    log_probs = common.next_token_log_probs(flat, pad_id, bos_id)
    token = tf.gather(log_probs, tf.reshape(targets, [-1, 1]), batch_dims=1)  # (B·t, 1)
    return cache, tf.reshape(token, [batch, width]), width


def _write_columns(seq, values, m):
    """seq (B, K, L + 1) with columns 1 .. m of every beam set to values (B, t) columns
    0 .. m - 1 (t >= m); shapes kept (XLA)."""
    columns = tf.shape(seq)[2]
    index = tf.clip_by_value(tf.range(columns) - 1, 0, tf.shape(values)[1] - 1)
    spread = tf.gather(values, index, axis=1)  # (B, L + 1)
    inside = (tf.range(columns) >= 1) & (tf.range(columns) <= m)
    return tf.where(inside[None, None, :], tf.cast(spread, seq.dtype)[:, None, :], seq)
