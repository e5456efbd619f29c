"""tfxformer.decoding.scoring: log P(target | source) by teacher forcing."""

import numpy as np
import pytest
import tensorflow as tf
from support.decoding import VOCAB

from tfxformer import Transformer
from tfxformer.decoding import BOS_ID, greedy_decode, score_targets

SOURCE = tf.constant([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 13, 14, 3, 0, 0]])
TARGET = tf.constant([[20, 21, 22, 3, 0], [3, 0, 0, 0, 0], [30, 31, 32, 33, 3]])


def _tiny(seed):
    tf.random.set_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    model.build()
    return model


@pytest.fixture(scope="module")
def models():
    return _tiny(21), _tiny(22)


def _keras_log_probs(model, source, target):
    """(B, T, V) log-softmax of the Keras model called on (source, BOS + target[:-1])."""
    inputs = np.concatenate([np.full((len(target), 1), BOS_ID), np.asarray(target)[:, :-1]], 1)
    logits = model((source, tf.constant(inputs, tf.int32))).numpy().astype(np.float64)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _chosen(log_probs, target):
    target = np.asarray(target)
    token = np.take_along_axis(log_probs, target[..., None], axis=-1)[..., 0]
    return np.where(target != 0, token, 0.0)


def test_scores_are_the_keras_models_teacher_forced_log_probs(models):
    model = models[0]
    out = score_targets(model, SOURCE, TARGET)
    expected = _chosen(_keras_log_probs(model, SOURCE, TARGET), TARGET)
    np.testing.assert_allclose(out.token_log_probs, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out.lengths, [4, 1, 5])  # EOS counted, PAD not
    np.testing.assert_allclose(out.scores, expected.sum(1), rtol=1e-5)
    assert np.all(out.token_log_probs.numpy()[TARGET.numpy() == 0] == 0.0)


def test_a_search_output_scores_its_search_score(models):
    """Scoring what greedy decoding (or sampling) produced gives the search's own score:
    the same float32 log-softmax, whether read step by step or teacher-forced."""
    model = models[0]
    for options in ({}, dict(sampling_topk=0, seed=4)):
        out = greedy_decode(model, SOURCE, extra_length=6, **options)
        np.testing.assert_allclose(score_targets(model, SOURCE, out.ids).scores, out.scores,
                                   rtol=1e-5)
        np.testing.assert_array_equal(score_targets(model, SOURCE, out.ids).lengths,
                                      out.lengths)


def test_an_ensemble_scores_with_its_averaged_probabilities(models):
    out = score_targets(list(models), SOURCE, TARGET)
    probs = [np.exp(_keras_log_probs(m, SOURCE, TARGET)) for m in models]
    expected = _chosen(np.log((probs[0] + probs[1]) / 2), TARGET)
    np.testing.assert_allclose(out.token_log_probs, expected, rtol=1e-5, atol=1e-5)
    sampled = greedy_decode(list(models), SOURCE, extra_length=6, sampling_topk=5, seed=8)
    np.testing.assert_allclose(score_targets(list(models), SOURCE, sampled.ids).scores,
                               sampled.scores, rtol=1e-5)
