"""A forced target prefix decoded in one pass (tfxformer.decoding.prefill) gives the
step-by-step search's output: ids equal, scores and token log-probabilities to float
rounding, on one model, an ensemble and a shortlist, a growing and a static cache (XLA)."""

import numpy as np
import pytest
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.decoding import beam_search, sequence_beam_search, transformer_decoder
from tfxformer.decoding.prefill import forced_columns
from tfxformer.decoding.steering import make_steering

SOURCE = [[5, 6, 7, 8, 9, 3], [9, 10, 3, 0, 0, 0], [11, 12, 13, 14, 3, 0]]
# mixed lengths: 5, 3 (reaches sentence 1's limit of 3 + 2 = 5 less one) and 7 (past
# sentence 2's limit of 5 + 2 = 7: forced to the end)
PREFIX = [[20, 21, 22, 23, 24], [30, 31, 30, 31], [40, 41, 42, 40, 41, 42, 43]]


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(0)
    from tfxformer.config import get_preset

    return Transformer(get_preset("tiny", vocab_size=64))


def _steering(prefix=PREFIX, **controls):
    return make_steering(len(prefix), prefix=tf.ragged.constant(prefix), **controls)


def _same(one_pass, stepwise):
    """One pass and step by step agree: ids and steps equal, scores and per-token
    log-probabilities to float32 rounding."""
    np.testing.assert_array_equal(one_pass.ids, stepwise.ids)
    np.testing.assert_array_equal(one_pass.steps, stepwise.steps)
    real = stepwise.scores.numpy() > -1e8
    np.testing.assert_allclose(one_pass.scores.numpy()[real], stepwise.scores.numpy()[real],
                               rtol=1e-5, atol=1e-5)
    if stepwise.token_log_probs is not None:
        np.testing.assert_allclose(one_pass.token_log_probs.numpy()[real],
                                   stepwise.token_log_probs.numpy()[real], atol=2e-5)


def _both(model, source=SOURCE, steering=None, jit=False, **options):
    """(one pass, step by step); `jit`: the one pass XLA-compiled."""
    options = {"beam_size": 3, "alpha": 0.6, "extra_length": 2,
               "steering": steering or _steering(), **options}

    def run(prefill):
        def search(source):
            return beam_search(model, source, prefill_prefix=prefill, **options)
        if jit and prefill:
            search = tf.function(search, jit_compile=True)
        return search(tf.constant(source))

    return run(True), run(False)


@pytest.mark.parametrize("options", [
    dict(token_log_probs=True, stopping="bound"),
    dict(token_log_probs=True, stopping="finished", length_normalization="length"),
    dict(static_cache=True, token_log_probs=True),
    dict(beam_size=1, alpha=0.0, stopping="finished"),
], ids=["bound", "finished", "static", "beam1"])
def test_one_pass_equals_step_by_step(model, options):
    """Mixed prefix lengths in one batch (one reaching its limit, one past it), the
    stopping rules, a static cache, per-token log-probabilities."""
    one_pass, stepwise = _both(model, **options)
    _same(one_pass, stepwise)
    ids = one_pass.ids.numpy()
    assert (ids[0, :, :5] == PREFIX[0]).all() and (ids[1, :, :4] == PREFIX[1]).all()
    assert ids[2, 0, :7].tolist() == PREFIX[2][:7]  # the limit: the prefix, no EOS


def test_repetition_controls_follow_the_prefix_position_by_position(model):
    """The penalty and the n-gram bans of each prefix position see the history up to it
    (the prefixes repeat tokens; after 30, 31 is banned at position 3 of the second)."""
    prefix = [PREFIX[0], [30, 31, 30, 32], PREFIX[2]]
    steering = _steering(prefix, no_repeat_ngram_size=2, repetition_penalty=1.8)
    one_pass, stepwise = _both(model, steering=steering, token_log_probs=True)
    _same(one_pass, stepwise)
    plain, _ = _both(model, steering=_steering(prefix), token_log_probs=True)
    assert not np.allclose(plain.token_log_probs[1, 0, :4], one_pass.token_log_probs[1, 0, :4])
    # a prefix repeating a bigram (30 31 30 31, n = 2) is written as given, by both paths
    repeats = _steering([PREFIX[0], [30, 31, 30, 31], PREFIX[2]], no_repeat_ngram_size=2)
    one_pass, stepwise = _both(model, steering=repeats, token_log_probs=True)
    _same(one_pass, stepwise)
    assert (one_pass.ids.numpy()[1, :, :4] == [30, 31, 30, 31]).all()
    assert np.isfinite(one_pass.scores.numpy()[1]).all()


def test_an_ensemble_and_a_shortlist(model):
    """Two members' averaged probabilities; a shortlist (the prefix in its columns)."""
    tf.random.set_seed(1)
    other = Transformer(model.model_config)
    one_pass, stepwise = _both([model, other], token_log_probs=True)
    _same(one_pass, stepwise)
    shortlist = np.array([0, 1, 2, 3] + list(range(5, 50)), np.int32)
    columns = [np.searchsorted(shortlist, row).tolist() for row in PREFIX]
    one_pass, stepwise = _both(model, steering=_steering(columns), shortlist=shortlist)
    _same(one_pass, stepwise)
    assert (one_pass.ids.numpy()[0, :, :5] == PREFIX[0]).all()


@pytest.mark.slow  # XLA-compiles a beam search (~20 s on 2 cores)
def test_the_xla_compiled_search_with_a_static_cache(model):
    """Every shape fixed: the pass' width is the prefix tensor's (the output's less one)."""
    one_pass, stepwise = _both(model, static_cache=True, jit=True)
    _same(one_pass, stepwise)


def _counted_search(model, steering, **options):
    """(output, steps the loop ran) of a beam search whose step function counts its calls
    (eager: the loop's body runs once per step)."""
    start = transformer_decoder(model, tf.constant(SOURCE), 3, 2)
    calls = []

    def step_fn(*args):
        calls.append(1)
        return start.step_fn(*args)

    out = sequence_beam_search(start._replace(step_fn=step_fn), 3, steering=steering,
                               **options)
    return out, len(calls)


def test_the_pass_replaces_the_common_prefix_steps_and_skips_what_it_cannot(model):
    """m = the fewest forced columns of the batch; none with m < 2, with constraints, or
    when asked not to (prefill_prefix=False)."""
    steering = _steering()
    assert int(forced_columns(steering, tf.constant([8, 5, 7]), 3)) == 4
    assert int(forced_columns(steering, tf.constant([8, 3, 7]), 3)) == 2
    assert int(forced_columns(_steering([[4, 3, 5], [6, 7]]), tf.constant([9, 9]), 3)) == 1
    _, steps = _counted_search(model, steering)
    _, stepwise = _counted_search(model, steering, prefill_prefix=False)
    assert steps == stepwise - 4
    short = _steering([[20], [30, 31], [40, 41]])
    assert _counted_search(model, short)[1] == _counted_search(model, short,
                                                               prefill_prefix=False)[1]
    phrase = tf.ragged.constant([[[50]], [[]], [[51, 52]]])
    constrained = make_steering(3, prefix=tf.ragged.constant(PREFIX), constraints=phrase)
    out, steps = _counted_search(model, constrained)
    reference, stepwise = _counted_search(model, constrained, prefill_prefix=False)
    assert steps == stepwise
    np.testing.assert_array_equal(out.ids, reference.ids)
    empty = make_steering(3, prefix=tf.ragged.constant(PREFIX),
                          constraints=tf.ragged.constant([[[]], [[]], [[]]]))
    assert _counted_search(model, empty)[1] == stepwise - 4  # none at runtime: the pass
