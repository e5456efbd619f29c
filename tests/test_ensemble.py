"""Ensemble decoding (tfxformer.decoding.ensemble): members' probabilities averaged in one
search, the Translator over an ensemble, its SavedModel export and scripts/export.py."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import BOS_ID, EOS_ID, beam_search, greedy_decode
from tfxformer.decoding.common import next_token_log_probs
from tfxformer.decoding.ensemble import ensemble_decoder, ensemble_log_probs

VOCAB = 40
SOURCE = tf.constant([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 3, 0, 0, 0, 0]])


def _tiny(seed, vocab_size=VOCAB, max_positions=32):
    tf.random.set_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=vocab_size, max_positions=max_positions)
    model.build()
    return model


@pytest.fixture(scope="module")
def pair():
    return _tiny(7), _tiny(8, max_positions=24)


def _assert_same(out, ref):
    np.testing.assert_array_equal(out.ids.numpy(), ref.ids.numpy())
    np.testing.assert_array_equal(out.lengths.numpy(), ref.lengths.numpy())
    np.testing.assert_allclose(out.scores.numpy(), ref.scores.numpy(), atol=1e-5)


def test_an_ensemble_of_one_model_twice_is_that_model(pair):
    model = pair[0]
    _assert_same(beam_search([model, model], SOURCE, beam_size=3, extra_length=3),
                 beam_search(model, SOURCE, beam_size=3, extra_length=3))
    _assert_same(greedy_decode((model, model), SOURCE, extra_length=3),
                 greedy_decode(model, SOURCE, extra_length=3))
    _assert_same(greedy_decode([model], SOURCE, extra_length=3),
                 greedy_decode(model, SOURCE, extra_length=3))


def _teacher_forced_probs(model, source, prefix):
    """(B, V) next-token probabilities of `model` after `prefix` (B, T), BOS first."""
    logits = model((source, prefix), training=False)
    return tf.nn.softmax(tf.cast(logits[:, -1], tf.float32)).numpy()


def test_greedy_ensemble_takes_the_argmax_of_the_averaged_probabilities(pair):
    out = greedy_decode(list(pair), SOURCE, extra_length=3, eos_id=None)
    prefix = np.full([SOURCE.shape[0], 1], BOS_ID)
    for t in range(out.ids.shape[1]):
        probs = (_teacher_forced_probs(pair[0], SOURCE, prefix)
                 + _teacher_forced_probs(pair[1], SOURCE, prefix)) / 2
        probs[:, [0, BOS_ID]] = 0.0  # PAD and BOS are never generated
        expected = probs.argmax(axis=1)
        running = out.lengths.numpy() > t
        np.testing.assert_array_equal(out.ids.numpy()[running, t], expected[running])
        prefix = np.concatenate([prefix, out.ids.numpy()[:, t:t + 1]], axis=1)
    # The limits are those of the smaller position table (24) and the source lengths.
    np.testing.assert_array_equal(out.lengths.numpy(), [6 + 3, 3 + 3, 2 + 3])


def test_ensemble_log_probs_are_normalized_and_left_as_they_are():
    logits = [tf.random.normal([5, VOCAB]), tf.random.normal([5, 1, VOCAB]) * 3.0]
    log_probs = ensemble_log_probs(logits)
    expected = np.log((tf.nn.softmax(logits[0]).numpy()
                       + tf.nn.softmax(logits[1][:, 0]).numpy()) / 2)
    np.testing.assert_allclose(log_probs.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(tf.reduce_logsumexp(log_probs, axis=-1).numpy(), 0.0,
                               atol=1e-5)
    renormalized = next_token_log_probs(log_probs).numpy()
    allowed = [i for i in range(VOCAB) if i not in (0, BOS_ID)]
    np.testing.assert_allclose(renormalized[:, allowed], log_probs.numpy()[:, allowed],
                               atol=1e-5)


def test_beam_ensemble_keeps_each_members_cache_with_its_beams(pair):
    """Sentences leave the batch and beams reorder: the growing-cache search equals the
    static-cache one, where nothing leaves."""
    growing = beam_search(list(pair), SOURCE, beam_size=3, extra_length=3)
    static = beam_search(list(pair), SOURCE, beam_size=3, extra_length=3, static_cache=True)
    _assert_same(growing, static)
    assert (growing.ids.numpy()[:, :, 0] != 0).all()


def test_members_must_share_the_vocabulary(pair):
    other = _tiny(9, vocab_size=VOCAB + 2)
    with pytest.raises(ValueError, match=r"vocabulary sizes are \[40, 42\]"):
        ensemble_decoder([pair[0], other], SOURCE)
    with pytest.raises(ValueError, match="at least one model"):
        beam_search([], SOURCE)


def test_an_ensemble_takes_a_shortlist(pair):
    model = pair[0]
    shortlist = tf.constant([0, 1, 2, 3, 5, 8, 13, 21, 34], tf.int32)
    _assert_same(beam_search([model, model], SOURCE, beam_size=2, extra_length=3,
                             shortlist=shortlist),
                 beam_search(model, SOURCE, beam_size=2, extra_length=3, shortlist=shortlist))
    assert EOS_ID in shortlist.numpy()
