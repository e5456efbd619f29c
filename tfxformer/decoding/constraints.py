"""Terminology constraints in beam search: lexically constrained decoding with dynamic
beam allocation (Post & Vilar, 2018, "Fast Lexically Constrained Decoding with Dynamic
Beam Allocation for Neural Machine Translation"; not in the Transformer paper).

Each sentence has phrases (token sequences) every output must hold, flattened into
(B', T) tokens, PAD after, with `continues` (B', T) True where token t is followed by
token t + 1 of the same phrase (:class:`tfxformer.decoding.steering.Steering`). Each alive
hypothesis carries a :class:`ConstraintState`: which constraint tokens it has met and
the last met token of a phrase it is inside, as sockeye's `ConstrainedHypothesis`
(`met`, `last_met`, `allowed()`, `advance()`): a token that starts an unmet phrase meets
that phrase's first token; inside a phrase the next token meets the phrase's next one,
and any other token un-meets the whole phrase (it must appear contiguously; that token
may then start a phrase, where sockeye drops it).

Each phrase is written exactly as often as it is given (a phrase given twice, twice: the
count sockeye and fairseq give a repeated constraint): once a hypothesis holds every copy
of a phrase, the token that would complete one more occurrence of it (its last n - 1
tokens are the phrase's first n - 1; for a one-token phrase, the token itself) is banned
before the softmax (:func:`standing`; a forced prefix is written as given), and every
occurrence counts, also one DBA's contiguous tracking misses (it was inside another
phrase, or restarted inside an overlapping match: 5 5 5 6 holds 5 5 6), which meets the
first unmet copy of the phrase whole (:func:`_occurrences`).

A constrained step (:func:`select`):

* EOS is banned for a hypothesis with unmet constraints;
* the candidates are the 2·K best extensions over K·V (the plain search's), plus every
  token each alive hypothesis is allowed (the first tokens of its unmet phrases, or the
  next token of the phrase it is inside), plus each hypothesis' best token; a candidate
  that repeats one before it (same hypothesis, same token) is dropped;
* each candidate's bank is the number of constraint tokens it has met, and its rank the
  number of better-scored candidates in its bank; the candidates are ordered by (rank,
  higher bank first), fairseq's `LexicallyConstrainedBeamSearch` "stripes", so the beam
  is shared out across the banks, the furthest-along hypotheses first;
* in that order, the first K candidates that do not end stay alive, and those of the
  first K that end (EOS, or the output limit) join the finished ones.

A hypothesis that reaches its output limit with unmet constraints still finishes (the
search must end); an output that ends before its limit holds every phrase. The searches
rank such incomplete outputs after the complete ones (:func:`finished_rank`). A row
without constraint tokens is decoded as by the plain search (the same candidates in the
same order: the stripes of one bank are the score order).

Shapes: B' sentences, K beam size, V vocabulary, T constraint tokens, C candidates
(2K + K·T + K).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.decoding import phrases
from tfxformer.decoding.common import NEG_INF
from tfxformer.decoding.topk import top_k
from tfxformer.ids import PAD_ID

__all__ = ["ConstraintState", "Selection", "Standing", "finished_rank", "initial_state",
           "present", "select", "standing"]

# Subtracted from the score of a finished output with unmet constraints when the
# finished ones are ranked: complete outputs first (finite, above NEG_INF / 2).
_INCOMPLETE = 1e6


class ConstraintState(NamedTuple):
    """Per alive hypothesis: met (B', K, T) bool, the constraint tokens it has written;
    last (B', K) int32, the last met token (-1: none since). Per sentence, worked out once
    per search (or () to work them out at each step): the phrases' places
    (:class:`tfxformer.decoding.phrases.Layout`) and twins (:func:`standing`)."""

    met: tf.Tensor
    last: tf.Tensor
    places: object = ()
    twins: object = ()


class Selection(NamedTuple):
    """One step's choice among the extensions of the alive hypotheses: 2K candidates,
    the first K those that may finish, and K alive ones among the 2K."""

    log_probs: tf.Tensor  # (B', 2K) float32 log P of each candidate
    beams: tf.Tensor  # (B', 2K) int32 the alive hypothesis it extends
    tokens: tf.Tensor  # (B', 2K) int32 its token
    alive: tf.Tensor  # (B', K) int32 index in the 2K of the hypotheses kept alive
    alive_log_probs: tf.Tensor  # (B', K) float32, NEG_INF for an ended one
    incomplete: tf.Tensor  # (B', 2K) bool: the candidate has unmet constraints
    constraint_state: object  # a ConstraintState of the K alive ones, or ()


class Standing(NamedTuple):
    """Where the alive hypotheses stand against their sentence's phrases before a step
    (:func:`standing`)."""

    places: phrases.Layout  # each constraint column's place in its phrase
    twins: tf.Tensor  # (B', T, T) bool: last columns of phrases with the same tokens
    completes: tf.Tensor  # (B', K, T) bool: writing token t completes its phrase
    bans: tf.Tensor  # (B'·K, V) bool: tokens that would write a phrase once too often


def present(constraints) -> tf.Tensor:
    """() bool: any sentence has a constraint token."""
    return tf.reduce_any(tf.not_equal(constraints, PAD_ID))


def initial_state(constraints, beam_size, continues=None) -> ConstraintState:
    """Nothing met: (B, K, T) False, (B, K) -1; with the `continues` flags, the phrases'
    places and twins too."""
    batch, columns = tf.shape(constraints)[0], tf.shape(constraints)[1]
    places, twins = (), ()
    if continues is not None:
        places = phrases.layout(constraints, continues)
        twins = phrases.twins(constraints, places)
    return ConstraintState(tf.zeros([batch, beam_size, columns], tf.bool),
                           tf.fill([batch, beam_size], -1), places, twins)


def _phrases(constraints, continues):
    """(valid (B', T) bool, starts (B', T) bool: the first token of a phrase, phrase
    (B', T) int32: the phrase each token belongs to)."""
    valid = tf.not_equal(constraints, PAD_ID)
    after = tf.pad(continues, [[0, 0], [1, 0]])[:, :-1]  # token t - 1 continues into t
    starts = valid & ~after
    phrase = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
    return valid, starts, phrase


def _in_phrase(last, continues):
    """(B', M) bool: `last` (B', M) is a met token followed by one of its phrase."""
    return (last >= 0) & tf.gather(continues, tf.maximum(last, 0), batch_dims=1)


def _advance(met, last, tokens, constraints, continues):
    """The state after writing `tokens` (B', C) from the states met (B', C, T) and last
    (B', C) (sockeye's `advance`, a mismatch inside a phrase may start one) -> (met,
    last)."""
    valid, starts, phrase = _phrases(constraints, continues)
    columns = tf.range(tf.shape(constraints)[1])[None, None, :]
    inside = _in_phrase(last, continues)  # (B', C)
    following = tf.minimum(last + 1, tf.shape(constraints)[1] - 1)
    expected = tf.gather(constraints, following, batch_dims=1)
    matched = inside & tf.equal(tokens, expected)
    current = tf.gather(phrase, tf.maximum(last, 0), batch_dims=1)  # (B', C)
    broken = (inside & ~matched)[..., None] & tf.equal(phrase[:, None, :], current[..., None])
    met = (met & ~broken) | (matched[..., None] & tf.equal(columns, following[..., None]))
    startable = (~matched[..., None] & ~met & starts[:, None, :]
                 & tf.equal(constraints[:, None, :], tokens[..., None]))
    started = tf.reduce_any(startable, axis=-1)
    first = tf.argmax(tf.cast(startable, tf.int32), axis=-1, output_type=tf.int32)
    met |= started[..., None] & tf.equal(columns, first[..., None])
    last = tf.where(matched, last + 1, tf.where(started, first, -1))
    return met & valid[:, None, :], last


def _allowed(state, constraints, continues):
    """(B', K, T) bool: the constraint tokens each alive hypothesis may write next to
    advance (sockeye's `allowed()`): its phrase's next token while inside one, else the
    first tokens of its unmet phrases."""
    valid, starts, _ = _phrases(constraints, continues)
    inside = _in_phrase(state.last, continues)  # (B', K)
    columns = tf.range(tf.shape(constraints)[1])[None, None, :]
    following = tf.equal(columns, (state.last + 1)[..., None])
    unmet_starts = ~state.met & starts[:, None, :]
    return tf.where(inside[..., None], following, unmet_starts) & valid[:, None, :]


def _done(met, places, twins):
    """(complete (B', M, T) bool: the phrase ending at column t is met; done (B', M,
    T) int32: how many phrases with that one's tokens are met)."""
    complete = met & places.ends[:, None, :]
    done = tf.linalg.matmul(tf.cast(complete, tf.float32), tf.cast(twins, tf.float32))
    return complete, tf.cast(tf.round(done), tf.int32)


def standing(history, length, state, constraints, continues, vocab) -> Standing:
    """The :class:`Standing` of the alive hypotheses, `history` (B', K, L) their tokens,
    the first `length` () int32 written: a phrase given n times is written n times,
    never more, so the token that would complete one more occurrence of a phrase whose
    copies are all met is banned (set to NEG_INF before the softmax by the search)."""
    places, twins = state.places, state.twins
    if not isinstance(places, phrases.Layout):
        places = phrases.layout(constraints, continues)
        twins = phrases.twins(constraints, places)
    completes = phrases.completions(history, length, constraints, places)
    _, done = _done(state.met, places, twins)
    copies = tf.reduce_sum(tf.cast(twins, tf.int32), axis=-1)[:, None, :]  # (B', 1, T)
    full = completes & (done >= copies)
    return Standing(places, twins, completes, phrases.scatter_tokens(full, constraints,
                                                                     vocab))


def _occurrences(met, last, tokens, completes, constraints, standing):
    """The state (met (B', C, T), last (B', C)) after :func:`_advance` with every
    occurrence of a phrase that `tokens` (B', C) complete (`completes` (B', C, T) of the
    hypotheses they extend) counted: where DBA's contiguous tracking did not complete a
    phrase with its tokens (it was tracking another phrase, or restarted inside an
    overlapping match), the first unmet copy of it is met whole."""
    places, twins = standing.places, standing.twins
    occurs = completes & tf.equal(tokens[..., None], constraints[:, None, :])
    tracked = (last >= 0) & tf.gather(places.ends, tf.maximum(last, 0), batch_dims=1)
    counted = tracked[..., None] & tf.gather(twins, tf.maximum(last, 0), batch_dims=1)
    complete, done = _done(met, places, twins)
    index = tf.range(tf.shape(constraints)[1])
    rank = tf.reduce_sum(tf.cast(twins & (index[None, None, :] < index[None, :, None]),
                                 tf.int32), axis=-1)  # (B', T) copies before it
    target = occurs & ~counted & ~complete & tf.equal(done, rank[:, None, :])
    whole = tf.gather(target, tf.broadcast_to(places.last[:, None, :], tf.shape(target)),
                      batch_dims=2) & places.valid[:, None, :]  # (B', C, T)
    inside = (last >= 0) & tf.gather(whole, tf.maximum(last, 0)[..., None],
                                     batch_dims=2)[..., 0]
    return met | whole, tf.where(inside, -1, last)


def _before(scores, group):
    """(B', C) int32: candidates of the same `group` (B', C) ahead of each one (a higher
    score, or an equal one earlier in the list)."""
    count = tf.shape(scores)[1]
    earlier = tf.range(count)[None, :] < tf.range(count)[:, None]  # [c, c'] c' before c
    same = tf.equal(group[:, :, None], group[:, None, :])
    ahead = (scores[:, None, :] > scores[:, :, None]) | (
        tf.equal(scores[:, None, :], scores[:, :, None]) & earlier[None])
    return tf.reduce_sum(tf.cast(same & ahead, tf.int32), axis=-1)


def select(log_probs, alive_log_probs, state, constraints, continues, ended_fn, eos_id,
           standing=None):
    """One constrained step (module docstring).

    Args:
        log_probs: (B'·K, V) next-token log-probabilities (steered, a prefix forced).
        alive_log_probs: (B', K) log P of the alive hypotheses.
        state: their :class:`ConstraintState`.
        constraints, continues: (B', T) the sentences' constraint tokens and flags.
        ended_fn: tokens (B', M) -> (B', M) bool, the candidates that end (EOS or limit).
        eos_id: the end token (-1: none).
        standing: None, or the alive hypotheses' :class:`Standing` (its bans applied to
            `log_probs`): every occurrence of a phrase is counted, DBA's or not.

    Returns:
        A :class:`Selection`.
    """
    k = alive_log_probs.shape[1] or tf.shape(alive_log_probs)[1]
    batch = tf.shape(alive_log_probs)[0]
    vocab = tf.shape(log_probs)[-1]
    valid_tokens = tf.not_equal(constraints, PAD_ID)
    unmet = tf.reduce_any(~state.met & valid_tokens[:, None, :], axis=-1)  # (B', K)
    log_probs = tf.reshape(log_probs, [batch, k, vocab])
    is_eos = tf.equal(tf.range(vocab), eos_id)[None, None, :]
    total = tf.where(unmet[..., None] & is_eos, NEG_INF, log_probs) + alive_log_probs[..., None]
    beams, tokens, offered = _candidates(total, state, constraints, continues)
    key = beams * vocab + tokens  # the candidate's index among the K·V extensions
    scores = tf.gather(tf.reshape(total, [batch, -1]), key, batch_dims=1)
    count = tf.shape(key)[1]
    earlier = tf.range(count)[None, :] < tf.range(count)[:, None]
    repeated = tf.reduce_any(tf.equal(key[:, :, None], key[:, None, :]) & earlier[None]
                             & offered[:, None, :], axis=-1)
    usable = offered & ~repeated & (scores > NEG_INF / 2)

    met, last = _advance(tf.gather(state.met, beams, batch_dims=1),
                         tf.gather(state.last, beams, batch_dims=1), tokens, constraints,
                         continues)
    if standing is not None:
        met, last = _occurrences(met, last, tokens, tf.gather(standing.completes, beams,
                                                              batch_dims=1),
                                 constraints, standing)
    bank = tf.reduce_sum(tf.cast(met, tf.int32), axis=-1)  # (B', C) tokens met
    needed = tf.reduce_sum(tf.cast(valid_tokens, tf.int32), axis=1)[:, None]
    order, after = _stripes(scores, usable, bank, tf.shape(constraints)[1])
    ended = ended_fn(tokens)
    _, first = tf.math.top_k(-order, k)  # the first K in stripe order
    _, alive = tf.math.top_k(-tf.where(usable & ~ended, order, after + order), k)
    chosen = tf.concat([first, alive], axis=1)  # (B', 2K)
    # a candidate filling a slot no usable one could is impossible: NEG_INF
    picked = tf.where(tf.gather(usable, chosen, batch_dims=1),
                      tf.gather(scores, chosen, batch_dims=1), NEG_INF)
    return Selection(
        log_probs=picked, beams=tf.gather(beams, chosen, batch_dims=1),
        tokens=tf.gather(tokens, chosen, batch_dims=1), alive=k + tf.range(k)[None, :]
        + tf.zeros([batch, 1], tf.int32),
        alive_log_probs=tf.where(tf.gather(ended, alive, batch_dims=1), NEG_INF,
                                 picked[:, k:]),
        incomplete=tf.gather(bank < needed, chosen, batch_dims=1),
        constraint_state=ConstraintState(tf.gather(met, alive, batch_dims=1),
                                         tf.gather(last, alive, batch_dims=1), state.places,
                                         state.twins))


def _candidates(total, state, constraints, continues):
    """The candidates of a step from total (B', K, V) log P of every extension: (beams,
    tokens, offered) each (B', C): the best 2K over K·V, every constraint slot of every
    hypothesis (offered where :func:`_allowed`), each hypothesis' best token."""
    batch, k, vocab = tf.shape(total)[0], total.shape[1] or tf.shape(total)[1], \
        tf.shape(total)[2]
    columns = tf.shape(constraints)[1]
    _, index = top_k(tf.reshape(total, [batch, k * vocab]), 2 * k)
    own = tf.argmax(total, axis=-1, output_type=tf.int32)  # (B', K)
    hypotheses = tf.broadcast_to(tf.range(k)[None, :], [batch, k])
    slots = tf.reshape(tf.broadcast_to(hypotheses[..., None], [batch, k, columns]),
                       [batch, -1])
    allowed_tokens = tf.broadcast_to(constraints[:, None, :], [batch, k, columns])
    beams = tf.concat([index // vocab, slots, hypotheses], axis=1)
    tokens = tf.concat([index % vocab, tf.reshape(allowed_tokens, [batch, -1]), own], axis=1)
    allowed = tf.reshape(_allowed(state, constraints, continues), [batch, -1])
    offered = tf.concat([tf.ones_like(index, tf.bool), allowed, tf.ones_like(own, tf.bool)],
                        axis=1)
    return beams, tokens, offered


def _stripes(scores, usable, bank, columns):
    """fairseq's stripes: (order (B', C) int32, the smaller the earlier; after () int32
    above every order): usable candidates by (rank in their bank, higher bank first), the
    unusable ones after them by score."""
    rank = _before(scores, tf.where(usable, bank, -1))
    after = tf.shape(scores)[1] * (columns + 1)
    return tf.where(usable, rank * (columns + 1) + (columns - bank), after + rank), 2 * after


def finished_rank(scores, incomplete):
    """The scores the finished hypotheses are ranked by: an output with unmet
    constraints (it reached its limit) after every complete one."""
    return tf.where(incomplete, scores - _INCOMPLETE, scores)
