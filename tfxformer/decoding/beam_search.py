"""Beam search with the GNMT length penalty (§6.1), on a step function.

§6.1: "we used beam search with a beam size of 4 and length penalty α = 0.6 ... We set
the maximum output length during inference to input length + 50, but terminate early
when possible." The length penalty is GNMT's, lp(Y) = ((5 + |Y|) / 6)^α, and a finished
hypothesis scores log P(Y | X) / lp(Y), where |Y| counts the EOS (as tensor2tensor);
`length_normalization="length"` divides by |Y|^α instead, |Y| without the EOS
(CTranslate2's `finalize_hypothesis_score`).

When to "terminate early" (`stopping`, :data:`tfxformer.config.STOPPING_RULES`): "bound"
ends a sentence once no alive hypothesis, even at the length penalty of its limit, could
beat the worst of its beam_size finished ones, so the n-best list is the full search's;
"finished" ends it once beam_size hypotheses have finished (CTranslate2's
`BeamSearch::search` with a length penalty, fairseq, Hugging Face's early_stopping=True),
which takes fewer steps and may keep a different n-best list.

Layout (as tensor2tensor's beam search): per sentence, `alive` keeps the beam_size best
hypotheses that have not ended and `finished` the beam_size best that have (by EOS or by
reaching the length limit), apart. Each step extends every alive hypothesis by every
token and takes the 2·beam_size best candidates. Those of the best beam_size that end
join `finished` (as in fairseq and OpenNMT: an ending candidate outside the beam is
dropped, so beam 1 is greedy decoding); the best beam_size that do not end stay alive
(2·beam_size candidates always hold enough). The step function runs on B'·K rows (B'
sentences still running): the per-hypothesis cache follows its hypotheses with one
`tf.gather` per step; the per-sentence context (the cross-attention memory) is shared by
the K beams and never moved, except when finished sentences leave the batch.

Terminology constraints (phrases every output must hold, in a
:class:`tfxformer.decoding.steering.Steering`) change which candidates stay alive and may
finish: :mod:`tfxformer.decoding.constraints` (dynamic beam allocation), run only when
the batch has a constraint token. A forced target prefix: the prefix columns every sentence
of the batch forces are decoded in one teacher-forced pass before the loop
(:mod:`tfxformer.decoding.prefill`), the rest of a longer prefix one step per token.

Shapes: B batch, B' sentences still running, K beam size, L output columns, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfxformer import checks
from tfxformer.config import LENGTH_NORMALIZATIONS, STOPPING_RULES
from tfxformer.decoding import common, constraints, prefill, topk
from tfxformer.decoding.common import NEG_INF, DecodeStart
from tfxformer.decoding.ensemble import decoder
from tfxformer.decoding.shortlist import mask_columns, to_vocabulary
from tfxformer.decoding.steering import (
    Steering,
    force_prefix,
    has_constraints,
    hypothesis_rows,
    steer_logits,
)
from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID


class BeamSearchOutput(NamedTuple):
    """N-best lists, best first: ids (B, K, L) int32 (EOS then PAD 0 after each
    hypothesis), lengths (B, K) tokens including the EOS, scores (B, K) float32
    log P(Y | X) / lp(Y); steps (B,) int32 the decoder steps each sentence ran (it left
    the batch after them; with a static cache every sentence runs the loop's steps; the
    columns of a prefix decoded in one pass count as steps);
    token_log_probs (B, K, L) float32 when asked for (`token_log_probs=True`, else None):
    the log-probability of each token under the distribution the search used (steered,
    a prefix forced), 0 after each hypothesis' end, so a row sums to log P(Y | X) =
    score × its length normalizer."""

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor
    steps: tf.Tensor
    token_log_probs: Any = None


class _BeamState(NamedTuple):
    """The `tf.while_loop` state of :func:`sequence_beam_search` (running sentences)."""

    i: tf.Tensor  # () int32 tokens generated so far
    rows: tf.Tensor  # (B',) int32 batch position of each running sentence
    limits: tf.Tensor  # (B',) int32 output tokens allowed
    alive_seq: tf.Tensor  # (B', K, L + 1) int32, column 0 BOS
    alive_log_probs: tf.Tensor  # (B', K) float32 log P of each alive hypothesis
    finished_seq: tf.Tensor  # (B', K, L + 1) int32
    finished_scores: tf.Tensor  # (B', K) float32 log P / lp, NEG_INF for empty slots
    finished_flags: tf.Tensor  # (B', K) bool: a real finished hypothesis
    cache: Any  # leaves (B' * K, ...), row b * K + k: alive hypothesis k of sentence b
    context: Any  # leaves (B', ...)
    steering: Any = ()  # a decoding.steering.Steering of the running sentences, or ()
    constraint_state: Any = ()  # a decoding.constraints.ConstraintState of the alive, or ()
    # (B', K, L + 1) float32 each token's log-probability (column 0 BOS: 0), or () off
    alive_token_log_probs: Any = ()
    finished_token_log_probs: Any = ()


def length_penalty(length, alpha):
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016; §6.1), float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.cast(alpha, tf.float32))


def length_normalizer(tokens, alpha, length_normalization="gnmt", ends_with_eos=False):
    """What the log-probability of a hypothesis of `tokens` tokens (a final EOS included
    if `ends_with_eos`, bool, broadcast) is divided by, float32: "gnmt", lp(Y) of
    :func:`length_penalty` (|Y| = `tokens`); "length", |Y|^α with |Y| = `tokens` without
    the EOS, as CTranslate2's `finalize_hypothesis_score` (the empty output counts 1, where
    CTranslate2 divides by 0). Both are non-decreasing in `tokens` for α >= 0."""
    checks.choice(length_normalization, "length_normalization", LENGTH_NORMALIZATIONS)
    if length_normalization == "gnmt":
        return length_penalty(tokens, alpha)
    length = tf.cast(tokens, tf.float32) - tf.cast(ends_with_eos, tf.float32)
    return tf.pow(tf.maximum(length, 1.0), tf.cast(alpha, tf.float32))


def _check_rules(stopping, length_normalization):
    """The two rules, checked (ValueError naming the bad one and the accepted values)."""
    return (checks.choice(stopping, "stopping", STOPPING_RULES),
            checks.choice(length_normalization, "length_normalization", LENGTH_NORMALIZATIONS))


def _check_options(beam_size, alpha):
    """Python values are checked now; tensors get graph assertions (clear errors)."""
    if isinstance(beam_size, (tf.Tensor, tf.Variable)):
        beam_size = common.checked(tf.cast(beam_size, tf.int32), tf.debugging.assert_positive,
                                   "`beam_size` must be >= 1")
    else:
        beam_size = checks.integer(beam_size, "beam_size", 1)
    if isinstance(alpha, (tf.Tensor, tf.Variable)):
        # α >= 0 makes lp non-decreasing in |Y|, which the early stop relies on.
        alpha = common.checked(tf.cast(alpha, tf.float32), tf.debugging.assert_non_negative,
                               "`alpha` must be >= 0")
    else:
        alpha = checks.number(alpha, "alpha", 0.0)
    return beam_size, alpha


def top_extensions(logits, alive_log_probs, count, pad_id=PAD_ID, bos_id=BOS_ID,
                   adjust=None):
    """The `count` best one-token extensions of each sentence's alive hypotheses.

    logits (B'·K, V) (or (B'·K, 1, V)), alive_log_probs (B', K) -> (log P (B', count)
    float32, best first; the hypothesis each extends (B', count); its token (B', count)).
    `adjust`: None, or a function of the (B'·K, V) next-token log-probabilities applied
    before the search adds them up (a forced prefix, :mod:`tfxformer.decoding.steering`).
    """
    log_probs = common.next_token_log_probs(logits, pad_id, bos_id)  # (B'·K, V)
    if adjust is not None:
        log_probs = adjust(log_probs)
    return _best_extensions(log_probs, alive_log_probs, count)


def _best_extensions(log_probs, alive_log_probs, count):
    """:func:`top_extensions` from the (B'·K, V) next-token log-probabilities."""
    k = alive_log_probs.shape[1] or tf.shape(alive_log_probs)[1]
    batch, vocab = tf.shape(alive_log_probs)[0], log_probs.shape[-1] or tf.shape(log_probs)[-1]
    log_probs = tf.reshape(log_probs, [batch, k, vocab]) + alive_log_probs[:, :, None]
    # tf.math.top_k's results, in two cheap passes over the K·V values (decoding.topk)
    log_probs, index = topk.top_k(tf.reshape(log_probs, [batch, k * vocab]), count)
    return log_probs, index // vocab, index % vocab


def sequence_beam_search(start: DecodeStart, beam_size=common.DEFAULTS.beam_size,
                         alpha=common.DEFAULTS.alpha, eos_id=EOS_ID, pad_id=PAD_ID,
                         bos_id=BOS_ID, static_cache=False, *,
                         stopping=common.DEFAULTS.stopping,
                         length_normalization=common.DEFAULTS.length_normalization,
                         steering=None, token_log_probs=False, prefill_prefix=True):
    """Beam search with the GNMT length penalty on a step function (§6.1).

    Runs inside one `tf.while_loop` (graph-safe; with `static_cache=True` and a Python
    `beam_size` XLA-compatible). Logits are normalized with a float32 log_softmax; PAD
    and BOS are never generated. A sentence is done when it reaches its limit, or by the
    `stopping` rule: "bound", when its best alive hypothesis, even at its longest length
    (the largest normalizer for α >= 0), cannot beat the worst of beam_size finished ones,
    so the n-best list is the one of the full search; "finished", when beam_size
    hypotheses have finished. Without `static_cache` a done sentence leaves the batch (see
    :mod:`common`); the loop stops when every sentence is done.

    Args:
        start: a :class:`DecodeStart` with `beam_size` hypotheses per sentence (cache
            rows b * K + k).
        beam_size: K >= 1; a Python int or a scalar int tensor.
        alpha: length penalty exponent α >= 0 (0 = plain log-probability).
        eos_id: the token that ends a hypothesis; None: none does (run to the limits).
        pad_id: written after a hypothesis' end; bos_id: the first decoder input.
        static_cache: the step function keeps every shape fixed (XLA); sentences then
            stay in the batch until all are done, their n-best lists held from the step
            they were done (the same output as without it).
        stopping: "bound" or "finished" (above; :data:`tfxformer.config.DEFAULT_STOPPING`).
        length_normalization: "gnmt" (lp(Y), §6.1) or "length" (|Y|^α without the EOS):
            :func:`length_normalizer`.
        steering: None, or a :class:`tfxformer.decoding.steering.Steering` of the B
            sentences (repetition control, a forced prefix, terminology constraints):
            applied to every step's logits; while a sentence's prefix is forced one
            hypothesis is alive; constraints steer which hypotheses stay alive and may
            finish (:mod:`tfxformer.decoding.constraints`).
        token_log_probs: a Python bool; True also returns each token's log-probability
            (tracked with the hypotheses: one (B', K, L) float array more in the loop);
            False (the default) builds the same graph as before.
        prefill_prefix: a Python bool; True (the default): the prefix columns every
            sentence of the batch forces are decoded in one teacher-forced pass before
            the loop when `start` has a prefill function (:mod:`tfxformer.decoding.prefill`;
            the same output as forcing them step by step, scores to float rounding);
            False forces each prefix token in a step of its own.

    Returns:
        :class:`BeamSearchOutput` (ids (B, K, L), lengths (B, K), scores (B, K),
        steps (B,) (prefilled columns counted), token_log_probs (B, K, L) or None).
    """
    beam_size, alpha = _check_options(beam_size, alpha)
    eos = common.check_ids(eos_id, pad_id, bos_id)
    search = BeamSearchLoop(start.step_fn, beam_size, alpha,
                            eos, pad_id, bos_id, stopping, length_normalization)
    batch = tf.shape(start.limits)[0]
    state = search.initial_state(start, token_log_probs)._replace(
        steering=() if steering is None else steering)
    if has_constraints(steering):
        state = state._replace(constraint_state=constraints.initial_state(
            steering.constraints, beam_size, steering.constraint_continues))
    if prefill_prefix and prefill.can_prefill(start, steering):
        state = prefill.prefill(state, start, steering, beam_size, eos, pad_id, bos_id,
                                static_cache)
    out = (tf.fill([batch, beam_size, start.output_columns], pad_id),
           tf.fill([batch, beam_size], NEG_INF), tf.zeros([batch], tf.int32),
           tf.zeros([batch, beam_size, start.output_columns]) if token_log_probs else ())

    def body(state, out_ids, out_scores, out_steps, out_token_lps):
        if static_cache:
            return (search.hold_done(state, search.step(state)), out_ids, out_scores,
                    out_steps, out_token_lps)
        state = search.step(state)
        done = search.done(state)

        def leave():
            gone = common.masked(state.rows, done)
            steps = common.scatter_rows(out_steps, gone, tf.fill(tf.shape(gone), state.i))
            token_lps = out_token_lps
            if token_log_probs:
                token_lps = common.scatter_rows(out_token_lps, gone, common.masked(
                    search.result_token_log_probs(state), done))
            return (*search.leave(state, done, out_ids, out_scores), steps, token_lps)

        return tf.cond(tf.reduce_any(done), leave,
                       lambda: (state, out_ids, out_scores, out_steps, out_token_lps))

    def cond(state, *_):
        return (state.i < start.output_columns) & ~tf.reduce_all(search.done(state))

    invariants = (common.loop_invariants(state, static_cache),
                  *tf.nest.map_structure(lambda t: t.shape, out))
    state, out_ids, out_scores, out_steps, out_token_lps = tf.while_loop(
        cond, body, (state, *out), shape_invariants=invariants)
    # Sentences still in the batch (all of them with a static cache).
    ids, scores = search.result(state)
    out_ids = common.scatter_rows(out_ids, state.rows, ids)
    out_scores = common.scatter_rows(out_scores, state.rows, scores)
    out_steps = common.scatter_rows(out_steps, state.rows, tf.fill(tf.shape(state.rows),
                                                                   state.i))
    lengths = tf.reduce_sum(tf.cast(out_ids != pad_id, tf.int32), axis=-1)
    if not token_log_probs:
        return BeamSearchOutput(out_ids, lengths, out_scores, out_steps)
    out_token_lps = common.scatter_rows(out_token_lps, state.rows,
                                        search.result_token_log_probs(state))
    return BeamSearchOutput(out_ids, lengths, out_scores, out_steps, out_token_lps)


def _tracks_token_log_probs(state):
    return isinstance(state.alive_token_log_probs, tf.Tensor)


def _gather(x, index):
    """x (B', N, ...) and index (B', M) -> (B', M, ...): x[b, index[b, m]]."""
    return tf.gather(x, index, batch_dims=1)


class BeamSearchLoop:
    """The loop pieces of :func:`sequence_beam_search` on its state (`initial_state`,
    `step`, `done`, `result`, `leave`), for a driver of one's own: a study ran them in
    XLA-compiled segments (bench/STUDIES.md: `git show
    677cc7a:bench/studies/xla_segments.py`).

    Args: the step function, K, α, and the end, pad and first ids (`eos_id` as
    :func:`tfxformer.decoding.common.check_ids` returns it: -1 for none); the `stopping`
    rule and the `length_normalization` (see :func:`sequence_beam_search`).
    """

    def __init__(self, step_fn, beam_size, alpha, eos_id, pad_id, bos_id,
                 stopping=common.DEFAULTS.stopping,
                 length_normalization=common.DEFAULTS.length_normalization):
        self.step_fn, self.beam_size, self.alpha = step_fn, beam_size, alpha
        self.eos_id, self.pad_id, self.bos_id = eos_id, pad_id, bos_id
        self.stopping, self.length_normalization = _check_rules(stopping,
                                                                length_normalization)

    def _normalizer(self, tokens, ends_with_eos=False):
        return length_normalizer(tokens, self.alpha, self.length_normalization, ends_with_eos)

    def initial_state(self, start, token_log_probs=False):
        """The state before the first step; `token_log_probs` (a Python bool): it also
        tracks each token's log-probability (:meth:`result_token_log_probs`)."""
        k, batch = self.beam_size, tf.shape(start.limits)[0]
        # Only beam 0 is live at first: the K beams start identical.
        first = tf.concat([tf.zeros([1]), tf.fill([k - 1], NEG_INF)], axis=0)
        seq = common.write_column(tf.fill([batch, k, start.output_columns + 1], self.pad_id), 0,
                                  tf.fill([batch, k], self.bos_id))
        token_lps = tf.zeros(tf.shape(seq)) if token_log_probs else ()
        return _BeamState(
            i=tf.constant(0), rows=tf.range(batch), limits=start.limits, alive_seq=seq,
            alive_log_probs=tf.tile(first[None], [batch, 1]), finished_seq=seq,
            finished_scores=tf.fill([batch, k], NEG_INF),
            finished_flags=tf.zeros([batch, k], tf.bool), cache=start.cache,
            context=start.context, alive_token_log_probs=token_lps,
            finished_token_log_probs=token_lps)

    def done(self, state):
        """(B',) bool: at its limit, or done by the stopping rule: "bound", K hypotheses
        finished and no alive one could still beat the worst of them (§6.1); "finished",
        K hypotheses finished."""
        full = tf.reduce_all(state.finished_flags, axis=1)
        if self.stopping == "bound":
            # The largest normalizer an alive hypothesis may reach: at its limit, no EOS.
            # (constraints order the alive ones by bank, not by score: the max)
            best_alive = tf.reduce_max(state.alive_log_probs, axis=1) / self._normalizer(
                state.limits)
            full &= tf.reduce_min(state.finished_scores, axis=1) > best_alive
        return full | (state.i >= state.limits)

    def hold_done(self, before, after):
        """`after` (one :meth:`step` on `before`) with the hypotheses of the sentences done
        in `before` as they were: a done sentence that stays in the batch (a static cache)
        returns what it would have returned on leaving it."""
        done = self.done(before)
        held = {}
        names = ["alive_seq", "alive_log_probs", "finished_seq", "finished_scores",
                 "finished_flags"]
        if _tracks_token_log_probs(before):
            names += ["alive_token_log_probs", "finished_token_log_probs"]
        for name in names:
            new = getattr(after, name)
            where = tf.reshape(done, [-1] + [1] * (new.shape.rank - 1))
            held[name] = tf.where(where, getattr(before, name), new)
        return after._replace(**held)

    def step(self, state):
        i, k = state.i, self.beam_size
        pick, cache, next_log_probs = self._grow(state)
        seq = common.write_column(_gather(state.alive_seq, pick.beams), i + 1, pick.tokens)
        log_probs, tokens = pick.log_probs, pick.tokens  # (B', 2K)
        ended = self._ended(tokens, i, state.limits)
        # Only the K first extensions of a step may finish (they are the beam; so beam 1
        # is greedy), and none that descends from no real hypothesis.
        in_beam = tf.range(2 * k) < k
        ended_real = ended & in_beam[None, :] & (log_probs > NEG_INF / 2)
        batch = tf.shape(pick.alive)[0]
        rows = tf.reshape(_gather(pick.beams, pick.alive) + tf.range(batch)[:, None] * k,
                          [-1])

        normalizer = self._normalizer(i + 1, tf.equal(tokens, self.eos_id))
        scores = tf.where(ended_real, log_probs / normalizer, NEG_INF)
        scores = tf.concat([state.finished_scores, scores], axis=1)  # (B', 3K)
        if has_constraints(state.steering):  # the finished ones so far are complete
            ranked = constraints.finished_rank(scores, tf.pad(pick.incomplete,
                                                              [[0, 0], [k, 0]]))
            _, best = tf.math.top_k(ranked, k=k)
            scores = _gather(scores, best)
        else:
            scores, best = tf.math.top_k(scores, k=k)
        if _tracks_token_log_probs(state):
            state = self._track_token_log_probs(state, pick, next_log_probs, best)
        return state._replace(
            i=i + 1, alive_seq=_gather(seq, pick.alive), alive_log_probs=pick.alive_log_probs,
            finished_seq=_gather(tf.concat([state.finished_seq, seq], axis=1), best),
            finished_scores=scores,
            finished_flags=_gather(tf.concat([state.finished_flags, ended_real], axis=1), best),
            cache=common.gather_rows(cache, rows), constraint_state=pick.constraint_state)

    def _track_token_log_probs(self, state, pick, next_log_probs, best):
        """`state` with its per-token log-probabilities following `pick`'s candidates as
        `alive_seq` and `finished_seq` do: each candidate's token's log-probability (from
        the (B'·K, V) `next_log_probs` the search added up) at column i + 1."""
        batch = tf.shape(pick.beams)[0]
        vocab = tf.shape(next_log_probs)[-1]
        flat = tf.reshape(next_log_probs, [batch, -1])  # (B', K·V)
        token = _gather(flat, pick.beams * vocab + pick.tokens)  # (B', 2K)
        seq = common.write_column(_gather(state.alive_token_log_probs, pick.beams),
                                  state.i + 1, token)
        finished = tf.concat([state.finished_token_log_probs, seq], axis=1)
        return state._replace(alive_token_log_probs=_gather(seq, pick.alive),
                              finished_token_log_probs=_gather(finished, best))

    def _ended(self, tokens, i, limits):
        """(B', M) bool: candidates of tokens (B', M) written at step `i` that end."""
        return tf.equal(tokens, self.eos_id) | (i + 1 >= limits[:, None])

    def _grow(self, state):
        """Scores every one-token extension of the alive hypotheses and picks the
        candidates (a :class:`tfxformer.decoding.constraints.Selection`): the best 2K,
        the K best that do not end alive; with constraints in the batch, the constrained
        step's."""
        i = state.i
        tokens = tf.reshape(state.alive_seq[:, :, i], [-1, 1])  # (B'·K, 1), the last token
        logits, cache = self.step_fn(tokens, i, state.cache, state.context)
        rows = None
        written = state.alive_seq[:, :, 1:]  # (B', K, L), BOS left out
        if isinstance(state.steering, Steering):
            rows = hypothesis_rows(state.steering, self.beam_size)
            logits = steer_logits(logits, tf.reshape(written, [-1, tf.shape(written)[2]]), i,
                                  rows)

        def to_log_probs(logits):
            log_probs = common.next_token_log_probs(logits, self.pad_id, self.bos_id)
            return log_probs if rows is None else force_prefix(log_probs, i, rows)

        def plain():
            log_probs = to_log_probs(logits)
            best, beams, tokens = _best_extensions(log_probs, state.alive_log_probs,
                                                   2 * self.beam_size)
            ended = self._ended(tokens, i, state.limits)
            alive_log_probs, alive = tf.math.top_k(tf.where(ended, NEG_INF, best),
                                                   k=self.beam_size)
            return constraints.Selection(best, beams, tokens, alive, alive_log_probs,
                                         tf.zeros_like(ended), state.constraint_state), \
                log_probs

        if not has_constraints(state.steering):
            pick, log_probs = plain()
            return pick, cache, log_probs
        steer = state.steering

        def constrained():
            # a phrase is written as often as it is given: the token that would write it
            # once more is banned before the softmax, past the forced prefix
            stand = constraints.standing(written, i, state.constraint_state,
                                         steer.constraints, steer.constraint_continues,
                                         tf.shape(logits)[-1])
            free = i >= rows.prefix_lengths  # (B'·K,)
            log_probs = to_log_probs(tf.where(stand.bans & free[:, None], NEG_INF,
                                              tf.cast(logits, tf.float32)))
            return constraints.select(
                log_probs, state.alive_log_probs, state.constraint_state, steer.constraints,
                steer.constraint_continues, lambda t: self._ended(t, i, state.limits),
                self.eos_id, stand), log_probs

        pick, log_probs = tf.cond(constraints.present(steer.constraints), constrained, plain)
        return pick, cache, log_probs

    def result(self, state):
        """(ids (B', K, L), scores (B', K)): finished hypotheses, best first; the alive
        ones for a sentence with none."""
        any_finished = tf.reduce_any(state.finished_flags, axis=1)
        alive_scores = state.alive_log_probs / self._normalizer(state.i)
        seq = tf.where(any_finished[:, None, None], state.finished_seq, state.alive_seq)
        scores = tf.where(any_finished[:, None], state.finished_scores, alive_scores)
        return seq[:, :, 1:], scores

    def result_token_log_probs(self, state):
        """(B', K, L) float32: each token's log-probability in the hypotheses of
        :meth:`result` (a state made with `initial_state(..., token_log_probs=True)`)."""
        any_finished = tf.reduce_any(state.finished_flags, axis=1)
        values = tf.where(any_finished[:, None, None], state.finished_token_log_probs,
                          state.alive_token_log_probs)
        return values[:, :, 1:]

    def leave(self, state, done, out_ids, out_scores):
        """Writes the done sentences' n-best lists at their batch positions and keeps the
        rows of the others: sentence fields and context by sentence, cache by hypothesis."""
        ids, scores = self.result(state)
        gone = common.masked(state.rows, done)
        out_ids = common.scatter_rows(out_ids, gone, common.masked(ids, done))
        out_scores = common.scatter_rows(out_scores, gone, common.masked(scores, done))
        keep = common.running(done)
        fields = {name: common.gather_rows(value, keep)
                  for name, value in state._asdict().items() if name not in ("i", "cache")}
        cache = common.gather_rows(state.cache, common.hypothesis_rows(keep, self.beam_size))
        return _BeamState(i=state.i, cache=cache, **fields), out_ids, out_scores


def beam_search(model, source_ids, beam_size=common.DEFAULTS.beam_size,
                alpha=common.DEFAULTS.alpha, extra_length=common.DEFAULTS.extra_length,
                max_output_length=None, static_cache=False, *, eos_id=EOS_ID, shortlist=None,
                stopping=common.DEFAULTS.stopping,
                length_normalization=common.DEFAULTS.length_normalization, steering=None,
                token_log_probs=False, prefill_prefix=True, shortlist_mask=None):
    """Translates a batch with beam search and the GNMT length penalty (§6.1).

    :func:`transformer_decoder` (encode once; the key/value cache), or for several models
    :func:`tfxformer.decoding.ensemble.ensemble_decoder`, fed to
    :func:`sequence_beam_search`. XLA-compatible with `static_cache=True` when
    `beam_size` and `extra_length` are Python ints.

    Args:
        model: a :class:`tfxformer.Transformer`, or a list or tuple of them sharing a
            vocabulary: an ensemble, scored by its averaged probabilities (a list of one
            is that model).
        source_ids: (B, S) int ids, PAD 0, each row ending with EOS.
        beam_size: K >= 1 (default 4); a Python int or a scalar int tensor.
        alpha: length penalty exponent α >= 0 (default 0.6; 0 = plain log-probability).
        extra_length: output tokens allowed beyond the source length (default 50).
        max_output_length: optional lower cap on output tokens than the model's positions.
        static_cache: keep the self-attention cache at its full length L (needed under
            XLA; finished sentences then stay in the batch); by default it grows by one
            position per step and finished sentences leave the batch.
        eos_id: the end token (default EOS 3); None: no token ends a hypothesis (each
            runs to its limit, as benchmarks want).
        shortlist: None (the full vocabulary), or (V',) sorted vocabulary ids starting
            with the specials 0..3 (:func:`tfxformer.decoding.shortlist.shortlist_ids`):
            logits, softmax and top-k over those tokens only; the output ids are
            vocabulary ids, and the scores are normalized over the shortlist.
        shortlist_mask: None, or (V',) bool, False on the `shortlist` columns that only
            pad it to a fixed length (:func:`tfxformer.decoding.shortlist.pad_shortlist`,
            for XLA): their logits are -inf before the softmax, so the output is that of
            the shortlist without them.
        stopping: when a sentence ends before its limit: "bound" (the default,
            :data:`tfxformer.config.DEFAULT_STOPPING`: once no alive hypothesis could
            still win) or "finished" (once K hypotheses have finished, as CTranslate2).
        length_normalization: "gnmt" (default; ((5 + |Y|) / 6)^α, |Y| with the EOS) or
            "length" (|Y|^α, |Y| without the EOS, as CTranslate2).
        steering: None, or a :class:`tfxformer.decoding.steering.Steering` of the B
            sentences (:func:`tfxformer.decoding.steering.make_steering`: repetition
            penalty, no-repeat n-gram size, a forced prefix in the search's columns).
        token_log_probs: a Python bool; True also returns each token's log-probability
            under the distribution the search used (:func:`sequence_beam_search`).
        prefill_prefix: a Python bool; True (the default) decodes the prefix columns
            every sentence forces in one pass before the search's loop, False one step
            per prefix token (:func:`sequence_beam_search`; the same output).

    Returns:
        :class:`BeamSearchOutput` (ids (B, K, L), lengths (B, K), scores (B, K),
        steps (B,), token_log_probs (B, K, L) or None).

    Example:
    >>> model = Transformer.from_preset("tiny", vocab_size=50)
    >>> out = beam_search(model, tf.constant([[7, 8, 3]]), beam_size=2)
    >>> out.ids.shape[:2], out.scores.shape
    (TensorShape([1, 2]), TensorShape([1, 2]))
    """
    beam_size, alpha = _check_options(beam_size, alpha)
    _check_rules(stopping, length_normalization)
    shortlist = common.shortlist_tensor(shortlist, eos_id)
    start = decoder(model, source_ids, beam_size, extra_length, max_output_length,
                    static_cache, shortlist)
    if shortlist_mask is not None:
        if shortlist is None:
            raise ValueError("`shortlist_mask` needs a `shortlist` (it marks its padding).")
        start = start._replace(step_fn=mask_columns(start.step_fn, shortlist_mask),
                               prefill_fn=start.prefill_fn and mask_columns(start.prefill_fn,
                                                                            shortlist_mask))
    out = sequence_beam_search(start, beam_size, alpha, eos_id=eos_id,
                               static_cache=static_cache, stopping=stopping,
                               length_normalization=length_normalization, steering=steering,
                               token_log_probs=token_log_probs, prefill_prefix=prefill_prefix)
    if shortlist is None:
        return out
    return out._replace(ids=to_vocabulary(out.ids, shortlist))
