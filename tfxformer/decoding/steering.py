"""Per-sentence control of what a search may write: repetition control, a forced prefix
and terminology constraints.

Not in the paper; CTranslate2's decoding options, with its semantics
(`ctranslate2::RepetitionPenalty`, `NoRepeatNgram` and the hard target prefix of its
`decoding.cc`):

* `repetition_penalty` p (> 0; 1 = off; CTRL, Keskar et al., 2019): before the softmax,
  the logit of every token the hypothesis already holds (its forced prefix included) is
  divided by p where it is positive and multiplied by p where it is negative, so p > 1
  makes a repeat less likely.
* `no_repeat_ngram_size` n (0 = off): a token that would complete an n-gram the
  hypothesis already holds is banned (its logit set to NEG_INF before the softmax, so the
  other tokens' probabilities are renormalized); n = 1 bans every token already written.
  A forced prefix is written as given: no token of it is banned.
* `prefix`: the first tokens of the output are given (a translator's partial translation):
  while a hypothesis is inside its prefix, only the prefix's next token may follow,
  scored with the model's log-probability of it (the search's score stays log P(Y | X)).
* `constraints`: phrases (token sequences) every output of beam search must hold, each
  exactly as often as it is given (lexically constrained decoding with dynamic beam
  allocation, Post & Vilar, 2018; :mod:`tfxformer.decoding.constraints`). They are held
  flattened: (B, T) tokens, PAD after, and `constraint_continues` (B, T) bool, True
  where token t is followed by token t + 1 of the same phrase.
* `avoid`: phrases no output may hold (sockeye's `avoid`), held flattened as the
  constraints are (`avoid`, `avoid_continues`): the token that would complete one (the
  hypothesis' last n - 1 tokens are the phrase's first n - 1; a one-token phrase's token)
  is banned as the n-gram rule bans one; a forced prefix is written as given. Every
  search takes them.

A :class:`Steering` holds them per sentence; the searches apply it at each step to the
step function's logits (:func:`steer_logits`) and log-probabilities
(:func:`force_prefix`); beam search decodes the prefix columns every sentence of a batch
forces in one pass before its loop instead, with the same result
(:mod:`tfxformer.decoding.prefill`). An ensemble's step function returns
log-probabilities, which then play the logits' part. Without a Steering (None) a search
runs as it always did.

Shapes: B sentences, N rows of the step function (hypotheses), C output columns,
P prefix columns, V vocabulary.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tfxformer.decoding.common import NEG_INF, followed_in_row
from tfxformer.decoding.phrases import completions, layout, scatter_tokens, token_set
from tfxformer.ids import PAD_ID

__all__ = ["Steering", "flatten_constraints", "force_prefix", "has_constraints",
           "make_steering", "steer_logits"]


class Steering(NamedTuple):
    """Per-sentence output controls (module docstring); a search gathers its rows with
    the sentences (`tf.nest` leaves, leading axis B)."""

    no_repeat_ngram_size: tf.Tensor  # (B,) int32, 0 = off
    repetition_penalty: tf.Tensor  # (B,) float32 > 0, 1 = off
    prefix: tf.Tensor  # (B, P) int32 forced first tokens, PAD after each prefix
    prefix_lengths: tf.Tensor  # (B,) int32 tokens of each prefix, 0 = none
    constraints: Any = ()  # (B, T) int32 phrases' tokens, flattened, PAD after; () = none
    constraint_continues: Any = ()  # (B, T) bool: token t + 1 is the same phrase's next
    avoid: Any = ()  # (B, A) int32 phrases no output may hold, flattened, PAD after; ()
    avoid_continues: Any = ()  # (B, A) bool: token a + 1 is the same phrase's next


def _per_sentence(value, batch, dtype):
    value = tf.cast(value, dtype)
    return tf.broadcast_to(value, [batch]) if value.shape.rank == 0 else value


def make_steering(batch, no_repeat_ngram_size=0, repetition_penalty=1.0, prefix=None,
                  constraints=None, avoid=None):
    """The :class:`Steering` of `batch` sentences, or None when every option is off and a
    Python value (the search then runs as without steering).

    Args:
        batch: () int32 B.
        no_repeat_ngram_size: >= 0, a scalar or (B,) (0 = off).
        repetition_penalty: > 0, a scalar or (B,) (1 = off).
        prefix: None, or (B, P) int ids (PAD after each prefix) or a (B, None) ragged
            tensor: the forced first output tokens (no EOS).
        constraints: None, or per sentence the phrases every beam search output must
            hold: a (B, None, None) ragged tensor of token ids (sentence, phrase, token),
            or the flattened form, a pair ((B, T) ids, PAD after; (B, T) bool
            continues) (:func:`flatten_constraints`). Beam search only.
        avoid: None, or per sentence the phrases no output may hold, in the forms
            `constraints` takes. Every search.

    Raises:
        ValueError: a Python value out of range (tensors get graph assertions).
    """
    python = all(not isinstance(v, (tf.Tensor, tf.Variable))
                 for v in (no_repeat_ngram_size, repetition_penalty))
    if python:
        if isinstance(no_repeat_ngram_size, bool) or not isinstance(no_repeat_ngram_size, int) \
                or no_repeat_ngram_size < 0:
            raise ValueError("`no_repeat_ngram_size` must be an int >= 0 (0 = off), got "
                             f"{no_repeat_ngram_size!r}.")
        if not repetition_penalty > 0:
            raise ValueError("`repetition_penalty` must be a number > 0 (1 = off), got "
                             f"{repetition_penalty!r}.")
        if prefix is None and constraints is None and avoid is None \
                and no_repeat_ngram_size == 0 and repetition_penalty == 1.0:
            return None
    size = _per_sentence(no_repeat_ngram_size, batch, tf.int32)
    penalty = _per_sentence(repetition_penalty, batch, tf.float32)
    checks = [tf.debugging.assert_non_negative(size, message="`no_repeat_ngram_size` must "
                                               "be >= 0"),
              tf.debugging.assert_positive(penalty, message="`repetition_penalty` must be > 0")]
    if prefix is None:
        ids, lengths = tf.zeros([batch, 0], tf.int32), tf.zeros([batch], tf.int32)
    elif isinstance(prefix, tf.RaggedTensor):
        ids = tf.cast(prefix.to_tensor(PAD_ID), tf.int32)
        lengths = tf.cast(prefix.row_lengths(), tf.int32)
    else:
        ids = tf.cast(tf.convert_to_tensor(prefix), tf.int32)
        lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
    tokens, continues = _flat_phrases(constraints)
    with tf.control_dependencies(checks):
        return Steering(tf.identity(size), tf.identity(penalty), ids, lengths, tokens,
                        continues, *_flat_phrases(avoid))


def _flat_phrases(phrases):
    """None, (B, None, None) ragged phrases or a flattened pair -> ((B, T) int32 tokens,
    (B, T) bool continues), or ((), ()) for None."""
    if phrases is None:
        return (), ()
    if isinstance(phrases, tf.RaggedTensor):
        return flatten_constraints(phrases)
    tokens, continues = phrases
    tokens = tf.cast(tf.convert_to_tensor(tokens), tf.int32)
    return tokens, tf.cast(tf.convert_to_tensor(continues), tf.bool) & (tokens != PAD_ID)


def flatten_constraints(phrases):
    """(B, None, None) ragged phrases of token ids (empty phrases allowed) -> ((B, T)
    int32 tokens, PAD after; (B, T) bool: token t + 1 is the same phrase's next)."""
    phrases = tf.cast(phrases, tf.int32)
    pieces = phrases.values  # (B·P, None) the phrases' tokens
    continues = followed_in_row(pieces.row_lengths())
    splits = tf.gather(pieces.row_splits, phrases.row_splits)  # each sentence's tokens
    flat = tf.RaggedTensor.from_row_splits(pieces.flat_values, splits, validate=False)
    flags = tf.RaggedTensor.from_row_splits(continues, splits, validate=False)
    return flat.to_tensor(PAD_ID), flags.to_tensor(False)


def hypothesis_rows(steering: Steering, beams) -> Steering:
    """Each sentence's steering repeated for its `beams` hypotheses (row b * beams + k),
    its constraints left out (a beam search reads them per sentence)."""
    steering = steering._replace(constraints=(), constraint_continues=())
    return tf.nest.map_structure(lambda t: tf.repeat(t, beams, axis=0), steering)


def has_constraints(steering) -> bool:
    """Whether `steering` (a :class:`Steering`, None or ()) may hold constraints: their
    tensor is there and not known to have 0 columns (decided when tracing)."""
    return isinstance(steering, Steering) and isinstance(steering.constraints, tf.Tensor) \
        and steering.constraints.shape[1] != 0


def check_no_constraints(steering, search):
    """ValueError if `steering` has constraints: only beam search takes them."""
    if has_constraints(steering):
        raise ValueError(f"Terminology `constraints` need beam search; {search} does not "
                         "take them: use beam search (e.g. beam_size >= 1 with "
                         "tfxformer.decoding.beam_search) or leave `constraints` None.")


def _seen(history, valid, vocab):
    """(N, V) bool: the tokens of the first `valid` (() or (N,)) columns of `history`."""
    inside = tf.range(tf.shape(history)[1])[None, :] < tf.reshape(valid, [-1, 1])
    return token_set(history, inside & (history >= 0), vocab)


def _ngram_bans(history, valid, size, vocab):
    """(N, V) bool: tokens that would complete an n-gram (n = `size` (N,), 0 = off) the
    first `valid` tokens of `history` (N, C) already hold (CTranslate2's NoRepeatNgram)."""
    columns = tf.shape(history)[1]
    starts = tf.range(columns)[None, :]  # (1, C) the n-gram's first column j
    # an earlier n-gram lies inside the history: j + n - 1 < valid (the banned token at
    # column j + n - 1 is written), and n > 0
    match = (size[:, None] > 0) & (starts + size[:, None] - 1 < tf.reshape(valid, [-1, 1]))
    suffix_start = tf.reshape(valid, [-1]) - size + 1  # (N,) the last n - 1 tokens start

    def body(m, match):
        ahead = tf.gather(history, tf.minimum(starts[0] + m, columns - 1), axis=1)
        wanted = tf.gather(history, tf.clip_by_value(suffix_start + m, 0, columns - 1)[:, None],
                           batch_dims=1)  # (N, 1)
        return m + 1, match & ((m >= size[:, None] - 1) | tf.equal(ahead, wanted))

    longest = tf.reduce_max(tf.concat([size, [1]], axis=0))
    _, match = tf.while_loop(lambda m, _: m < longest - 1, body, [tf.constant(0), match])
    banned = tf.gather(history, tf.clip_by_value(starts[0][None, :] + size[:, None] - 1, 0,
                                                 columns - 1), batch_dims=1)  # (N, C)
    return token_set(banned, match, vocab)


def _avoid_bans(history, valid, tokens, continues, vocab):
    """(N, V) bool: the tokens that would complete a phrase of `tokens` (N, A) (with their
    `continues`) after the first `valid` (() or (N,)) tokens of `history` (N, C)."""
    completes = completions(history[:, None, :], tf.reshape(valid, [-1, 1]), tokens,
                            layout(tokens, continues))  # (N, 1, A)
    return scatter_tokens(completes, tokens, vocab)


def steer_logits(logits, history, valid, steering: Steering):
    """`logits` (N, V) (or (N, 1, V)) of N hypotheses, float32, with the repetition penalty,
    the n-gram bans and the phrases to avoid of `steering` (its rows those of the
    hypotheses) applied; history (N, C) int32 the tokens each hypothesis wrote so far,
    `valid` () or (N,) int32 of them."""
    if logits.shape.rank == 3:
        logits = logits[:, -1]
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[-1]
    history = tf.cast(history, tf.int32)
    penalty = steering.repetition_penalty[:, None]

    def penalized():
        seen = _seen(history, valid, vocab)
        scaled = tf.where(logits < 0.0, logits * penalty, logits / penalty)
        return tf.where(seen, scaled, logits)

    logits = tf.cond(tf.reduce_any(tf.not_equal(penalty, 1.0)), penalized, lambda: logits)
    size = steering.no_repeat_ngram_size
    # a row still inside its prefix writes the prefix as given: nothing banned there
    free = tf.reshape(valid, [-1]) >= steering.prefix_lengths  # (N,)

    def banned():
        bans = _ngram_bans(history, valid, size, vocab) & free[:, None]
        return tf.where(bans, NEG_INF, logits)

    logits = tf.cond(tf.reduce_any(size > 0), banned, lambda: logits)
    if not isinstance(steering.avoid, tf.Tensor):
        return logits

    def avoided():
        bans = _avoid_bans(history, valid, steering.avoid, steering.avoid_continues, vocab)
        return tf.where(bans & free[:, None], NEG_INF, logits)

    return tf.cond(tf.reduce_any(tf.not_equal(steering.avoid, PAD_ID)), avoided,
                   lambda: logits)


def force_prefix(log_probs, step, steering: Steering):
    """`log_probs` (N, V) with every token but the prefix's next one set to NEG_INF in the
    rows still inside their prefix at `step` () int32 (tokens written so far)."""
    inside = step < steering.prefix_lengths  # (N,)
    token = _prefix_token(steering.prefix, step)
    vocab = tf.shape(log_probs)[-1]
    only = tf.equal(tf.range(vocab)[None, :], token[:, None])
    return tf.where(inside[:, None] & ~only, NEG_INF, log_probs)


def _prefix_token(prefix, step):
    """(N,) the prefix token at column `step` (PAD past the prefix's columns)."""
    padded = tf.pad(prefix, [[0, 0], [0, 1]], constant_values=PAD_ID)
    column = tf.minimum(step, tf.shape(padded)[1] - 1)
    return tf.gather(padded, column, axis=1)

