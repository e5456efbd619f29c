"""tfxformer.decoding.sampling: temperature, top-k and top-p sampling in the greedy decoder."""

import numpy as np
import pytest
import tensorflow as tf
from support.decoding import VOCAB, BigramStub

from tfxformer import Transformer
from tfxformer.config import DecodingOptions
from tfxformer.decoding import BOS_ID, EOS_ID, PAD_ID, greedy_decode, greedy_search
from tfxformer.decoding.common import next_token_log_probs
from tfxformer.decoding.sampling import make_sampler, sample_tokens

PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
DRAWS = 20_000  # rows drawn at once: a frequency's standard error is at most 0.0035
SOURCE = tf.constant([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 13, 14, 3, 0, 0]])


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(11)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    model.build()
    return model


def _frequencies(topk=0, temperature=1.0, topp=1.0, seed=1):
    log_probs = tf.constant(np.tile(np.log(PROBS), (DRAWS, 1)), tf.float32)
    tokens = sample_tokens(log_probs, make_sampler(topk, temperature, topp, seed), 0)
    return np.bincount(tokens.numpy(), minlength=len(PROBS)) / DRAWS


def _renormalized(weights, kept):
    weights = np.where(np.arange(len(weights)) < kept, weights, 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize("topk, temperature, topp, expected", [
    (0, 1.0, 1.0, PROBS),                                  # the softmax itself
    (0, 2.0, 1.0, _renormalized(PROBS ** 0.5, 6)),         # flatter: p^(1/T)
    (0, 0.5, 1.0, _renormalized(PROBS ** 2.0, 6)),         # sharper
    (3, 1.0, 1.0, _renormalized(PROBS, 3)),                # the 3 most probable
    (0, 1.0, 0.7, _renormalized(PROBS, 3)),                # 0.4 + 0.25 < 0.7 <= + 0.15
    (4, 1.0, 0.5, _renormalized(PROBS, 2)),                # top-k, then top-p
])
def test_sampled_frequencies_match_the_softmax(topk, temperature, topp, expected):
    frequencies = _frequencies(topk, temperature, topp)
    np.testing.assert_allclose(frequencies, expected, atol=0.015)
    assert np.all(frequencies[expected == 0] == 0)  # never outside the kept tokens


def test_a_seed_reproduces_its_draws_and_another_draws_afresh(model):
    first = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=0, seed=5)
    again = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=0, seed=5)
    other = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=0, seed=6)
    np.testing.assert_array_equal(first.ids, again.ids)  # in a graph: test_scoring.py
    np.testing.assert_array_equal(first.scores, again.scores)
    assert not np.array_equal(first.ids, other.ids)
    greedy = greedy_decode(model, SOURCE, extra_length=8)
    assert not np.array_equal(first.ids, greedy.ids)


def test_top_k_sampling_only_picks_among_the_k_most_probable(model):
    """Every sampled token ranks among the 3 best of the model's distribution at its step
    (recomputed by a teacher-forced decode of the sampled prefix)."""
    out = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=3, seed=2)
    memory, mask = model.encode(SOURCE)
    inputs = tf.concat([tf.fill([3, 1], BOS_ID), out.ids[:, :-1]], axis=1)
    log_probs = next_token_log_probs(tf.reshape(model.decode(inputs, memory, mask),
                                                [-1, VOCAB])).numpy().reshape(3, -1, VOCAB)
    ids = out.ids.numpy()
    for b, length in enumerate(out.lengths.numpy()):
        for t in range(length):
            rank = np.sum(log_probs[b, t] > log_probs[b, t, ids[b, t]])
            assert rank < 3, (b, t, rank)
    assert not np.isin(ids, [BOS_ID]).any()


def test_top_1_sampling_is_greedy_and_python_top_1_takes_the_argmax(model):
    greedy = greedy_decode(model, SOURCE, extra_length=8)
    top1 = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=tf.constant(1),
                         sampling_temperature=tf.constant(3.0), seed=9)
    np.testing.assert_array_equal(top1.ids, greedy.ids)
    assert make_sampler(1, seed=None) is None  # no sampler, so no seed needed


def test_sampling_over_a_shortlist_draws_only_its_tokens(model):
    shortlist = [0, 1, 2, 3, 10, 12, 15, 20, 25, 33]
    out = greedy_decode(model, SOURCE, extra_length=8, sampling_topk=0, seed=1,
                        shortlist=shortlist)
    assert set(out.ids.numpy().ravel()) <= set(shortlist)
    assert len(set(out.ids.numpy().ravel()) - {PAD_ID, EOS_ID}) > 2  # drawn, not fixed


def test_the_search_draws_the_first_token_from_the_step_distribution():
    """Through greedy_search on a step function with forced probabilities: PAD and BOS are
    never drawn, and 3,000 first tokens follow the step's distribution."""
    stub = BigramStub({BOS_ID: {4: 0.5, 5: 0.3, 6: 0.2}, 4: {EOS_ID: 1.0},
                       5: {EOS_ID: 1.0}, 6: {EOS_ID: 1.0}})
    sampler = make_sampler(0, seed=tf.constant(3, tf.int64))
    out = greedy_search(stub.start(tf.fill([3000, 2], EOS_ID), extra_length=3),
                        sampler=sampler)
    first = out.ids.numpy()[:, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=8)[4:7] / 3000, [0.5, 0.3, 0.2],
                               atol=0.03)
    assert not np.isin(out.ids.numpy()[:, 1], [PAD_ID, BOS_ID]).any()  # EOS follows


def test_sampling_compiles_with_xla():
    """The keys are int32, the seed type XLA's StatelessMultinomial takes (an int64 seed
    is cut into its two halves)."""
    log_probs = tf.constant(np.tile(np.log(PROBS), (64, 1)), tf.float32)
    sampler = make_sampler(tf.constant(2), tf.constant(1.0), tf.constant(1.0),
                           tf.constant(2**40 + 3, tf.int64))
    tokens = tf.function(lambda: sampler.tokens(log_probs, tf.constant(4)),
                         jit_compile=True)()
    assert set(tokens.numpy()) <= {0, 1} and sampler.key.dtype == tf.int32


def test_bad_sampling_options_are_named():
    for bad, message in ((dict(sampling_topk=-1), "`sampling_topk` must be an integer >= 0"),
                         (dict(sampling_topk=10, sampling_temperature=0.0),
                          "`sampling_temperature` must be a number > 0"),
                         (dict(sampling_topk=10, sampling_topp=1.5),
                          r"`sampling_topp` must be a number in \[0.0, 1.0\]"),
                         (dict(sampling_topk=10, sampling_topp=0.0),
                          r"`sampling_topp` must be a number in \(0, 1\]"),
                         (dict(sampling_topk=10, beam_size=4),
                          "needs `beam_size` 1, got 4"),
                         (dict(sampling_temperature=0.7), "set `sampling_topk`")):
        with pytest.raises(ValueError, match=message):
            DecodingOptions(**{"beam_size": 1, **bad})
    options = DecodingOptions(beam_size=1, sampling_topk=10, sampling_temperature=0.8)
    assert DecodingOptions.from_dict(options.to_dict()) == options and options.sampling
    with pytest.raises(ValueError, match="needs a `seed`"):
        make_sampler(10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sampling_topk` must be >= 0"):
        make_sampler(tf.constant(-1), seed=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sampling_topp` must be in"):
        make_sampler(tf.constant(5), topp=tf.constant(0.0), seed=1)
