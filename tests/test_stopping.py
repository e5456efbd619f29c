"""Beam search's stopping rules ("bound", "finished") and length normalizations ("gnmt",
"length") in tfxformer.decoding.beam_search, on toy step functions and the tiny model."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from support.decoding import PENALTY_TABLE, A, BigramStub, hypothesis_ids

from tfxformer import Transformer
from tfxformer.config import DecodingOptions
from tfxformer.decoding import BOS_ID, EOS_ID, PAD_ID, greedy_search
from tfxformer.decoding.beam_search import length_normalizer, sequence_beam_search

RULES = [(stopping, normalization) for stopping in ("bound", "finished")
         for normalization in ("gnmt", "length")]


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(7)
    model = Transformer.from_preset("tiny", vocab_size=40, max_positions=32)
    model.build()
    return model


def _normalizer(hypothesis, alpha, normalization):
    """The divisor of a hypothesis' log P, in Python: ((5 + |Y|) / 6)^α with the EOS, or
    max(|Y| without the EOS, 1)^α."""
    if normalization == "gnmt":
        return ((5 + len(hypothesis)) / 6) ** alpha
    return max(len(hypothesis) - (hypothesis[-1] == EOS_ID), 1) ** alpha


def _log_p(stub, hypothesis, stop=None):
    """log P of `hypothesis` under `stub`, EOS raised by its `stop_bonus` from `stop` on."""
    total = 0.0
    for t, (prev, token) in enumerate(zip([BOS_ID] + hypothesis[:-1], hypothesis,
                                          strict=True)):
        logits = stub.log_probs.numpy()[prev].astype(np.float64)
        if stop is not None and t >= stop:
            logits[EOS_ID] += stub.stop_bonus
        total += logits[token] - np.log(np.exp(logits).sum())
    return total


def _exhaustive_best(stub, alpha, normalization, limit, tokens=(EOS_ID, A, A + 1)):
    """(score, hypothesis) maximizing log P / normalizer, by enumeration up to `limit`."""
    best = (-math.inf, None)
    for length in range(1, limit + 1):
        for hypothesis in itertools.product(tokens, repeat=length):
            hypothesis = list(hypothesis)
            if EOS_ID in hypothesis[:-1] or (length < limit and hypothesis[-1] != EOS_ID):
                continue
            score = _log_p(stub, hypothesis) / _normalizer(hypothesis, alpha, normalization)
            best = max(best, (score, hypothesis))
    return best


def _assert_well_formed(out, stub, alpha, normalization, limits, stops=None):
    """Every n-best list: K distinct real hypotheses, best first, each its tokens then PAD,
    ending with EOS unless at its limit, scored log P / its normalizer."""
    ids, lengths, scores = out.ids.numpy(), out.lengths.numpy(), out.scores.numpy()
    for b, limit in enumerate(limits):
        stop = None if stops is None else stops[b][0]
        hypotheses = hypothesis_ids(out.ids[b], out.lengths[b])
        assert len({tuple(h) for h in hypotheses}) == len(hypotheses)
        assert np.all(np.diff(scores[b]) <= 0), scores[b]
        for k, hypothesis in enumerate(hypotheses):
            assert np.all(ids[b, k, lengths[b, k]:] == PAD_ID)
            assert PAD_ID not in hypothesis and EOS_ID not in hypothesis[:-1]
            assert hypothesis[-1] == EOS_ID or len(hypothesis) == limit
            expected = _log_p(stub, hypothesis, stop) / _normalizer(hypothesis, alpha,
                                                                    normalization)
            np.testing.assert_allclose(scores[b, k], expected, rtol=1e-5)


# A random bigram table whose EOS is never the best token: a sentence ends at `stop` (its
# source's first id) if its limit (source length + 3) comes later, else at its limit.
_RNG = np.random.default_rng(0)
RANDOM = {prev: dict(zip((EOS_ID, 4, 5, 6, 7), [0.02, *_RNG.dirichlet([1.0] * 4) * 0.98],
                         strict=True)) for prev in (BOS_ID, 4, 5, 6, 7)}
MIXED = [[1, EOS_ID, 0, 0], [3, 6, 7, EOS_ID], [9, EOS_ID, 0, 0], [2, 5, EOS_ID, 0]]


@pytest.mark.parametrize("stopping, normalization, alpha", [
    ("bound", "gnmt", 0.0), ("bound", "length", 0.0), ("finished", "gnmt", 0.6),
    ("finished", "length", 1.0)])
def test_beam_one_is_greedy_under_both_rules(stopping, normalization, alpha):
    """Beam 1 gives greedy's tokens: under "finished" at any α (the first EOS in the beam
    ends the sentence), under "bound" at α = 0; its score is greedy's log P over the
    normalizer. Sentences end by EOS or at their limits, at different steps."""
    stub = BigramStub(RANDOM, stop_bonus=20.0)
    greedy = greedy_search(stub.start(MIXED, extra_length=3))
    beam = sequence_beam_search(stub.start(MIXED, beams=1, extra_length=3), beam_size=1,
                                alpha=alpha, stopping=stopping,
                                length_normalization=normalization)
    expected = hypothesis_ids(greedy.ids, greedy.lengths)
    assert hypothesis_ids(beam.ids[:, 0], beam.lengths[:, 0]) == expected
    assert [len(h) for h in expected] == [2, 4, 5, 3]  # EOS at 2, 4, 3; the limit at 5
    normalizers = [_normalizer(h, alpha, normalization) for h in expected]
    np.testing.assert_allclose(beam.scores[:, 0] * normalizers, greedy.scores, rtol=1e-5)
    assert beam.steps.numpy().tolist() == [2, 4, 5, 3]


@pytest.mark.parametrize("normalization, bound_steps", [("gnmt", 6), ("length", 10)])
def test_finished_stops_when_k_hypotheses_have_ended_where_the_bound_goes_on(
        normalization, bound_steps):
    """BOS -> EOS 0.3 | a 0.6 | b 0.1; a -> EOS 0.45 | a 0.55; b -> EOS 0.5 | b 0.5; beam 2,
    α 1, limit 10. [EOS] ends at step 1 and [a, EOS] at step 2: "finished" stops there
    with those two. The bound goes on: gnmt, until the best alive a⁶ (log P -3.50) / lp(10)
    = -1.40 falls below the worst finished [EOS] (-1.20), after step 6; length, whose |Y|^α
    rewards length at α 1, to the limit, where aaaaaaaaaa scores best (the full search's
    answer)."""
    stub, alpha, limit = BigramStub(PENALTY_TABLE), 1.0, 10
    finished = sequence_beam_search(stub.start([[A, EOS_ID]], beams=2, extra_length=limit - 2),
                                    beam_size=2, alpha=alpha, stopping="finished",
                                    length_normalization=normalization)
    assert stub.steps == 2 and finished.steps.numpy().tolist() == [2]
    _assert_well_formed(finished, stub, alpha, normalization, [limit])
    assert sorted(hypothesis_ids(finished.ids[0], finished.lengths[0])) == [[EOS_ID], [A, EOS_ID]]

    stub.rows.clear()
    bound = sequence_beam_search(stub.start([[A, EOS_ID]], beams=2, extra_length=limit - 2),
                                 beam_size=2, alpha=alpha, stopping="bound",
                                 length_normalization=normalization)
    assert stub.steps == bound_steps and bound.steps.numpy().tolist() == [bound_steps]
    _assert_well_formed(bound, stub, alpha, normalization, [limit])
    score, best = _exhaustive_best(stub, alpha, normalization, limit)
    assert hypothesis_ids(bound.ids[:, 0], bound.lengths[:, 0]) == [best]
    np.testing.assert_allclose(bound.scores[0, 0], score, rtol=1e-5)


# Two tokens share the mass, so no EOS is among a sentence's K best extensions before
# position `stop` (its source's first id), where EOS takes over: both rules end it there.
ALTERNATING = {prev: {A: 0.6, A + 1: 0.4, EOS_ID: 1e-4} for prev in (BOS_ID, A, A + 1)}
STOPS = [[1, EOS_ID], [4, EOS_ID], [2, EOS_ID]]


@pytest.mark.parametrize("stopping, normalization", RULES)
def test_finished_sentences_leave_the_batch_under_both_rules(stopping, normalization):
    """Sentences end after 2, 5 and 3 steps; with the growing cache the step function then
    sees only the rows still running (beam 2), and `steps` says when each left."""
    stub = BigramStub(ALTERNATING, stop_bonus=20.0)
    out = sequence_beam_search(stub.start(STOPS, beams=2), beam_size=2, alpha=0.6,
                               stopping=stopping, length_normalization=normalization)
    assert stub.rows == [6, 6, 4, 2, 2]
    assert out.steps.numpy().tolist() == [2, 5, 3]
    assert out.lengths.numpy().tolist() == [[2, 2], [5, 5], [3, 3]]
    _assert_well_formed(out, stub, 0.6, normalization, [52, 52, 52], STOPS)


def test_finished_rule_compiles_with_xla_on_a_static_cache():
    """The "finished" rule and |Y|^α under XLA: the same n-best lists as the growing cache,
    every sentence running the loop's 5 steps."""
    rules = dict(stopping="finished", length_normalization="length")
    growing = sequence_beam_search(BigramStub(ALTERNATING, stop_bonus=20.0).start(
        STOPS, beams=2), beam_size=2, alpha=0.6, **rules)
    static = BigramStub(ALTERNATING, stop_bonus=20.0)
    compiled = tf.function(lambda s: sequence_beam_search(
        static.start(s, beams=2, static_cache=True), 2, 0.6, static_cache=True, **rules),
        jit_compile=True)(tf.constant(STOPS))
    np.testing.assert_array_equal(compiled.ids, growing.ids)
    np.testing.assert_allclose(compiled.scores, growing.scores, rtol=1e-6)
    assert compiled.steps.numpy().tolist() == [5, 5, 5]


def test_rules_are_decoding_options_and_old_records_read_as_what_they_ran():
    options = DecodingOptions()
    changed = options.replace(stopping="finished", length_normalization="length")
    assert DecodingOptions.from_dict(changed.to_dict()) == changed
    old = {k: v for k, v in changed.to_dict().items()
           if k not in ("stopping", "length_normalization")}  # a record from before them
    assert DecodingOptions.from_dict(old) == changed.replace(stopping="bound",
                                                              length_normalization="gnmt")
    for bad, message in ((dict(stopping="early"),
                          "`stopping` must be one of 'bound', 'finished', got 'early'"),
                         (dict(length_normalization="average"),
                          "`length_normalization` must be one of 'gnmt', 'length'")):
        with pytest.raises(ValueError, match=message):
            options.replace(**bad)
        with pytest.raises(ValueError, match=message):
            sequence_beam_search(BigramStub(PENALTY_TABLE).start([[A, EOS_ID]], beams=2),
                                 beam_size=2, **bad)


def test_length_normalizer_formulas():
    """gnmt: ((5 + |Y|) / 6)^α, |Y| with the EOS; length: |Y|^α without it, at least 1."""
    tokens, eos = tf.constant([1, 2, 7, 7]), tf.constant([True, True, True, False])
    np.testing.assert_allclose(length_normalizer(tokens, 1.5, "gnmt", eos),
                               [1.0, (7 / 6) ** 1.5, 2.0 ** 1.5, 2.0 ** 1.5], rtol=1e-6)
    np.testing.assert_allclose(length_normalizer(tokens, 1.5, "length", eos),
                               [1.0, 1.0, 6 ** 1.5, 7 ** 1.5], rtol=1e-6)
