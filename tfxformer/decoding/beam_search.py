"""Beam search with the GNMT length penalty (§6.1), on the decoder's key/value cache.

§6.1: "we used beam search with a beam size of 4 and length penalty α = 0.6 ... We set
the maximum output length during inference to input length + 50, but terminate early
when possible." The length penalty is GNMT's, lp(Y) = ((5 + |Y|) / 6)^α, and a finished
hypothesis scores log P(Y | X) / lp(Y), where |Y| counts the EOS (as tensor2tensor).

Layout (as tensor2tensor's beam search): per sentence, `alive` keeps the beam_size best
hypotheses that have not ended and `finished` the beam_size best that have (by EOS or by
reaching the length limit), apart. Each step extends every alive hypothesis by every
token and takes the 2·beam_size best candidates. Those of the best beam_size that end
join `finished` (as in fairseq and OpenNMT: an ending candidate outside the beam is
dropped, so beam 1 is greedy decoding); the best beam_size that do not end stay alive
(2·beam_size candidates always hold enough). The model runs on B·beam rows: the
self-attention caches follow their hypotheses with one `tf.gather` per step; the
cross-attention cache, equal for all beams of a sentence, is kept once per sentence
(the beams' queries attend to it as extra query rows) and never moved.

Shapes: B batch, K beam size, S source length, L cache length, V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.decoding.greedy import (
    BOS_ID,
    DEFAULT_EXTRA_LENGTH,
    EOS_ID,
    NEG_INF,
    PAD_ID,
    cache_invariants,
    checked,
    decode_limits,
    next_token_log_probs,
    write_column,
)

DEFAULT_BEAM_SIZE = 4
DEFAULT_ALPHA = 0.6


class BeamSearchOutput(NamedTuple):
    """N-best lists, best first: ids (B, K, L) int32 (EOS then PAD 0 after each
    hypothesis), lengths (B, K) tokens including the EOS, scores (B, K) float32
    log P(Y | X) / lp(Y)."""

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor


def length_penalty(length, alpha):
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016; §6.1), float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, tf.cast(alpha, tf.float32))


def _check_options(beam_size, alpha):
    """Python values are checked now; tensors get graph assertions (clear errors)."""
    if isinstance(beam_size, (tf.Tensor, tf.Variable)):
        beam_size = checked(tf.cast(beam_size, tf.int32), tf.debugging.assert_positive,
                            "`beam_size` must be >= 1")
    elif isinstance(beam_size, bool) or int(beam_size) != beam_size or beam_size < 1:
        raise ValueError(f"`beam_size` must be an integer >= 1, got {beam_size!r}.")
    else:
        beam_size = int(beam_size)
    if isinstance(alpha, (tf.Tensor, tf.Variable)):
        # α >= 0 makes lp non-decreasing in |Y|, which the early stop relies on.
        alpha = checked(tf.cast(alpha, tf.float32), tf.debugging.assert_non_negative,
                        "`alpha` must be >= 0")
    elif not float(alpha) >= 0.0:
        raise ValueError(f"`alpha` (length penalty exponent) must be >= 0, got {alpha!r}.")
    else:
        alpha = float(alpha)
    return beam_size, alpha


def beam_search(model, source_ids, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                extra_length=DEFAULT_EXTRA_LENGTH, max_length=None, static_cache=False):
    """Translates a batch with beam search and the GNMT length penalty (§6.1).

    Runs inside one `tf.while_loop` (graph-safe; XLA-compatible when `beam_size` and
    `extra_length` are Python ints). Logits are computed for the last position only and
    normalized with a float32 log_softmax; PAD and BOS are never generated. A sentence
    is done when it reaches its length limit, or when its best alive hypothesis, even
    at the longest length (the best lp for α >= 0), cannot beat the worst of beam_size
    finished ones, so the returned n-best list is the one of the full search. The loop
    stops when every sentence is done.

    Args:
        model: a :class:`tfxformer.Transformer` (or any object with `encode`,
            `init_cache`, `decode_step` and `model_config["max_length"]`).
        source_ids: (B, S) int ids, PAD 0, each row ending with EOS.
        beam_size: K >= 1 (default 4); a Python int or a scalar int tensor.
        alpha: length penalty exponent α >= 0 (default 0.6; 0 = plain log-probability).
        extra_length: output tokens allowed beyond the source length (default 50).
        max_length: optional lower cap on output tokens than the model's positions.
        static_cache: keep the self-attention cache at its full length L (needed under
            XLA); by default it grows by one position per step (cheaper without XLA).

    Returns:
        :class:`BeamSearchOutput` (ids (B, K, L), lengths (B, K), scores (B, K)).

    Example:
    >>> model = Transformer.from_preset("tiny", vocab_size=50)
    >>> out = beam_search(model, tf.constant([[7, 8, 3]]), beam_size=2)
    >>> out.ids.shape[:2], out.scores.shape
    (TensorShape([1, 2]), TensorShape([1, 2]))
    """
    beam_size, alpha = _check_options(beam_size, alpha)
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_mask = model.encode(source_ids)
    limits, length = decode_limits(model, source_ids, source_mask, extra_length, max_length)
    batch = tf.shape(source_ids)[0]
    # Self-attention slots for the B*K hypotheses (row b*K + k); cross-attention keys and
    # values once per sentence, shared by its K beams.
    cache = model.init_cache(memory, length if static_cache else None,
                             batch_size=batch * beam_size)
    search = _Search(model, beam_size, alpha, limits, length, source_mask=source_mask,
                     cross=[c["cross"] for c in cache], static_cache=static_cache)
    state = search.initial_state(batch, [c["self"] for c in cache])
    invariants = {name: (cache_invariants(t, static_cache) if name == "cache" else t.shape)
                  for name, t in state.items()}
    state = tf.while_loop(search.not_done, lambda s: [search.step(s)], [state],
                          shape_invariants=[invariants])[0]
    return search.result(state)


def _gather(x, index):
    """x (B, N, ...) and index (B, M) -> (B, M, ...): x[b, index[b, m]]."""
    return tf.gather(x, index, batch_dims=1)


class _Search:
    """The loop body and condition of :func:`beam_search`; state is a dict of tensors."""

    def __init__(self, model, beam_size, alpha, limits, length, source_mask, cross,
                 static_cache):
        self.model, self.beam_size, self.alpha = model, beam_size, alpha
        self.limits, self.length = limits, length  # (B,), scalar
        self.source_mask, self.cross = source_mask, cross  # (B, S), per layer (B, H, S, K)
        self.static_cache = static_cache

    def initial_state(self, batch, self_cache):
        k, columns = self.beam_size, self.length + 1  # column 0 holds BOS
        # Only beam 0 is live at first: the K beams start identical.
        first = tf.concat([tf.zeros([1]), tf.fill([k - 1], NEG_INF)], axis=0)
        seq = write_column(tf.zeros([batch, k, columns], tf.int32), 0,
                           tf.fill([batch, k], BOS_ID))
        return {
            "i": tf.constant(0),
            "alive_seq": seq,
            "alive_log_probs": tf.tile(first[None], [batch, 1]),
            "finished_seq": seq,
            "finished_scores": tf.fill([batch, k], NEG_INF),
            "finished_flags": tf.zeros([batch, k], tf.bool),
            "cache": self_cache,
        }

    def not_done(self, state):
        """True while some sentence is below its limit and could still improve (§6.1)."""
        best_alive = state["alive_log_probs"][:, 0] / length_penalty(self.limits, self.alpha)
        worst_finished = tf.reduce_min(state["finished_scores"], axis=1)
        bound_met = tf.reduce_all(state["finished_flags"], axis=1) & (worst_finished > best_alive)
        done = bound_met | (state["i"] >= self.limits)
        return (state["i"] < self.length) & ~tf.reduce_all(done)

    def step(self, state):
        i = state["i"]
        seq, log_probs, beams, tokens, cache = self._grow(state)
        ended = tf.equal(tokens, EOS_ID) | (i + 1 >= self.limits[:, None])  # (B, 2K)
        # Only the K best extensions of a step may finish (they are the beam; so beam 1
        # is greedy), and none that descends from no real hypothesis.
        in_beam = tf.range(2 * self.beam_size) < self.beam_size
        ended_real = ended & in_beam[None, :] & (log_probs > NEG_INF / 2)

        alive_log_probs = tf.where(ended, NEG_INF, log_probs)
        alive_log_probs, alive = tf.math.top_k(alive_log_probs, k=self.beam_size)  # (B, K)
        batch = tf.shape(alive)[0]
        rows = tf.reshape(_gather(beams, alive) + tf.range(batch)[:, None] * self.beam_size, [-1])
        cache = tf.nest.map_structure(lambda t: tf.gather(t, rows), cache)  # self-attn only

        scores = tf.where(ended_real, log_probs / length_penalty(i + 1, self.alpha), NEG_INF)
        scores = tf.concat([state["finished_scores"], scores], axis=1)  # (B, 3K)
        scores, best = tf.math.top_k(scores, k=self.beam_size)
        return {
            "i": i + 1,
            "alive_seq": _gather(seq, alive),
            "alive_log_probs": alive_log_probs,
            "finished_seq": _gather(tf.concat([state["finished_seq"], seq], axis=1), best),
            "finished_scores": scores,
            "finished_flags": _gather(
                tf.concat([state["finished_flags"], ended_real], axis=1), best),
            "cache": cache,
        }

    def _grow(self, state):
        """Scores every one-token extension of the alive hypotheses; keeps the best 2K."""
        i, k = state["i"], self.beam_size
        alive_seq = state["alive_seq"]  # (B, K, L + 1)
        tokens = tf.reshape(alive_seq[:, :, i], [-1, 1])  # (B*K, 1), the last token only
        cache = [{"self": s, "cross": c} for s, c in zip(state["cache"], self.cross, strict=True)]
        logits, cache = self.model.decode_step(tokens, self.source_mask, cache, i,
                                               append_cache=not self.static_cache, beams=k)
        log_probs = next_token_log_probs(logits[:, -1])  # (B*K, V) float32
        vocab = tf.shape(log_probs)[-1]
        batch = tf.shape(alive_seq)[0]
        log_probs = tf.reshape(log_probs, [batch, k, vocab])
        log_probs += state["alive_log_probs"][:, :, None]
        log_probs, index = tf.math.top_k(tf.reshape(log_probs, [batch, k * vocab]), k=2 * k)
        beams, tokens = index // vocab, index % vocab  # (B, 2K)
        seq = write_column(_gather(alive_seq, beams), i + 1, tokens)  # (B, 2K, L + 1)
        return seq, log_probs, beams, tokens, [c["self"] for c in cache]

    def result(self, state):
        """Finished hypotheses, best first; alive ones for a sentence with none."""
        any_finished = tf.reduce_any(state["finished_flags"], axis=1)
        alive_scores = state["alive_log_probs"] / length_penalty(state["i"], self.alpha)
        seq = tf.where(any_finished[:, None, None], state["finished_seq"], state["alive_seq"])
        scores = tf.where(any_finished[:, None], state["finished_scores"], alive_scores)
        ids = seq[:, :, 1:]
        lengths = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=-1)
        return BeamSearchOutput(ids, lengths, scores)
