"""Per-token log-probabilities of beam search hypotheses (`beam_search(...,
token_log_probs=True)`): they add up to each hypothesis' log P, equal a teacher-forced
pass over it, and leave the default search as it was."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import beam_search, score_targets
from tfxformer.decoding.beam_search import length_normalizer
from tfxformer.decoding.steering import make_steering
from tfxformer.ids import EOS_ID

VOCAB = 40
SOURCE = tf.constant([[7, 8, 9, 10, EOS_ID], [11, 12, EOS_ID, 0, 0], [13, EOS_ID, 0, 0, 0]])


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(3)
    return Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)


def _search(model, **options):
    options = {"beam_size": 3, "alpha": 0.6, "extra_length": 6, **options}
    return beam_search(model, SOURCE, **options)


def _assert_sums(out, alpha, length_normalization):
    """Each real hypothesis' token log-probabilities add up to score × normalizer and
    are 0 after its end."""
    ids, lengths = out.ids.numpy(), out.lengths.numpy()
    token = out.token_log_probs.numpy()
    assert token.shape == ids.shape and token.dtype == np.float32
    ends = ids[np.arange(ids.shape[0])[:, None], np.arange(ids.shape[1])[None, :],
               np.maximum(lengths - 1, 0)] == EOS_ID
    normalizer = length_normalizer(lengths, alpha, length_normalization, ends).numpy()
    real = out.scores.numpy() > -1e8
    assert real.any()
    np.testing.assert_allclose(token.sum(-1)[real], (out.scores.numpy() * normalizer)[real],
                               rtol=1e-5, atol=1e-4)
    after = np.arange(ids.shape[2])[None, None, :] >= lengths[..., None]
    assert np.all(token[after & real[..., None]] == 0.0)


@pytest.mark.parametrize("length_normalization", ["gnmt", "length"])
def test_token_log_probs_add_up_to_the_score(model, length_normalization):
    out = _search(model, length_normalization=length_normalization, token_log_probs=True)
    _assert_sums(out, 0.6, length_normalization)


def test_default_search_is_unchanged(model):
    """Without the flag no log-probabilities are returned; with it the hypotheses, scores
    and steps are the same."""
    plain, tracked = _search(model), _search(model, token_log_probs=True)
    assert plain.token_log_probs is None
    for name in ("ids", "lengths", "scores", "steps"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(tracked, name))


def test_token_log_probs_equal_teacher_forced_scores(model):
    """Without steering the search's distribution is the model's: each hypothesis'
    log-probabilities are those of a teacher-forced pass over it."""
    out = _search(model, token_log_probs=True)
    for k in range(3):
        forced = score_targets(model, SOURCE, out.ids[:, k])
        np.testing.assert_allclose(out.token_log_probs[:, k], forced.token_log_probs,
                                   rtol=1e-4, atol=1e-4)


def test_static_cache_gives_the_same_token_log_probs(model):
    dynamic = _search(model, token_log_probs=True)
    static = _search(model, token_log_probs=True, static_cache=True)
    np.testing.assert_array_equal(dynamic.ids, static.ids)
    np.testing.assert_allclose(dynamic.token_log_probs, static.token_log_probs, atol=1e-5)


def test_steered_and_constrained_token_log_probs_add_up(model):
    """Under a repetition penalty, a forced prefix and constraints the log-probabilities
    are those of the steered distribution: they still add up to the score."""
    steering = make_steering(3, repetition_penalty=1.5,
                             prefix=tf.ragged.constant([[5, 6], [], []]),
                             constraints=tf.ragged.constant([[[20]], [[21, 22]], []],
                                                            ragged_rank=2))
    out = _search(model, steering=steering, token_log_probs=True)
    _assert_sums(out, 0.6, "gnmt")
    assert np.all(out.ids.numpy()[0, :, :2] == [5, 6])
