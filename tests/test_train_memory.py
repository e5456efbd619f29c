"""The fused projection + label-smoothed loss: the same loss and gradients as the loss on
the logits, without a (B, T, V) tensor; and the Trainer's fused path equals its logits path."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

from tfxformer import Transformer
from tfxformer.layers.ops import matmul_last
from tfxformer.losses import fused_label_smoothed_nll, label_smoothed_per_token
from tfxformer.trainer import Trainer, decoder_output

RNG = np.random.default_rng(3)
B, T, D, V = 3, 5, 8, 50


def _case(dtype=tf.float32):
    hidden = tf.constant(RNG.normal(size=(B, T, D)), dtype)
    embeddings = tf.Variable(RNG.normal(size=(V, D)), dtype=tf.float32)
    labels = RNG.integers(1, V, size=(B, T))
    labels[0, 3:] = 0  # padding
    labels[2, 1:] = 0
    labels = tf.constant(labels, tf.int32)
    # Per-token sample weights, zero at the padding (as the Trainer's mask * factor).
    weights = tf.cast(labels != 0, tf.float32) * tf.constant(
        RNG.uniform(0.5, 2.0, size=(B, T)), tf.float32)
    return hidden, embeddings, labels, weights


def _loss_on_logits(hidden, embeddings, labels, weights, epsilon):
    logits = tf.cast(matmul_last(hidden, tf.cast(embeddings, hidden.dtype), transpose_b=True),
                     tf.float32)
    per_token, _ = label_smoothed_per_token(labels, logits, epsilon)
    return tf.reduce_sum(per_token * weights)


def _values_and_grads(loss_fns, hidden, embeddings, mode):
    """[loss, d hidden, d embeddings] of each of `loss_fns`, all in one function (one trace,
    one XLA compilation in modes "graph" and "xla")."""
    def run(hidden):
        results = []
        for loss_fn in loss_fns:
            with tf.GradientTape() as tape:
                tape.watch(hidden)
                loss = loss_fn(hidden) * 3.0  # an upstream gradient that is not 1
            d_hidden, d_embeddings = tape.gradient(loss, [hidden, embeddings])
            results.append((loss, d_hidden, tf.convert_to_tensor(d_embeddings)))
        return results
    if mode != "eager":
        run = tf.function(run, jit_compile=mode == "xla")
    return [[t.numpy().astype("float32") for t in result] for result in run(hidden)]


def _value_and_grads(loss_fn, hidden, embeddings, mode):
    return _values_and_grads([loss_fn], hidden, embeddings, mode)[0]


CHUNK_ROWS = (None, 1000, 4, 1)  # no loop; one chunk; 4 of 4 rows; 1 row each
EPSILONS = (0.1, 0.0)


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_fused_loss_equals_loss_on_logits(mode):
    """Every chunking with both label smoothings, all in one traced function per mode."""
    hidden, embeddings, labels, weights = _case()

    def on_logits(epsilon):
        return lambda h: _loss_on_logits(h, embeddings, labels, weights, epsilon)

    def fused(epsilon, chunk_rows):
        return lambda h: fused_label_smoothed_nll(
            h, embeddings, labels, weights, epsilon,
            chunk_elements=None if chunk_rows is None else chunk_rows * V)

    cases = [(epsilon, rows) for epsilon in EPSILONS for rows in CHUNK_ROWS]
    results = _values_and_grads([on_logits(epsilon) for epsilon in EPSILONS]
                                + [fused(epsilon, rows) for epsilon, rows in cases],
                                hidden, embeddings, mode)
    references = dict(zip(EPSILONS, results, strict=False))
    for (epsilon, rows), result in zip(cases, results[len(EPSILONS):], strict=True):
        for got, want in zip(result, references[epsilon], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"epsilon {epsilon}, chunk_rows {rows}")
    for reference in references.values():
        assert np.abs(reference[1][2, 1:]).max() == 0  # padded tokens: no gradient


def test_fused_loss_bf16_matches_loss_on_logits():
    hidden, embeddings, labels, weights = _case(tf.bfloat16)
    reference = _value_and_grads(
        lambda h: _loss_on_logits(h, embeddings, labels, weights, 0.1), hidden, embeddings,
        "graph")
    fused = _value_and_grads(
        lambda h: fused_label_smoothed_nll(h, embeddings, labels, weights, 0.1,
                                           chunk_elements=4 * V),
        hidden, embeddings, "graph")
    assert fused[0] == pytest.approx(reference[0], rel=1e-3)
    for got, want in zip(fused[1:], reference[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=0.02, atol=0.02 * np.abs(want).max())


def test_fused_loss_holds_one_chunk_of_logits_not_all():
    """The allocator's peak during the fused gradient stays far below one (N, V) tensor;
    the loss on the logits needs more than one. TensorFlow's CPU allocator keeps
    statistics only as the BFC one, chosen when TensorFlow starts: the test runs itself
    again in a process that has it (the test processes run the default allocator)."""
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
        test = f"{os.path.abspath(__file__)}::test_fused_loss_holds_one_chunk_of_logits_not_all"
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
             "no:xdist", "-rs", test], capture_output=True, text=True, cwd=os.path.dirname(
                os.path.abspath(__file__)), env={**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"},
            check=False)
        assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
        return
    n, depth, vocab = 2048, 32, 4096
    hidden = tf.constant(RNG.normal(size=(n, depth)), tf.float32)
    embeddings = tf.Variable(RNG.normal(size=(vocab, depth)) * 0.1, dtype=tf.float32)
    labels = tf.constant(RNG.integers(1, vocab, size=(n,)), tf.int32)
    weights = tf.ones([n])
    logits_bytes = n * vocab * 4

    def peak(loss_fn):
        @tf.function
        def run(hidden):
            with tf.GradientTape() as tape:
                tape.watch(hidden)
                loss = loss_fn(hidden)
            return tape.gradient(loss, [hidden, embeddings])
        run(hidden)  # trace
        try:
            tf.config.experimental.reset_memory_stats("CPU:0")
            base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        except ValueError:
            pytest.skip("this TensorFlow's CPU allocator keeps no statistics")
        run(hidden)
        return tf.config.experimental.get_memory_info("CPU:0")["peak"] - base

    unfused = peak(lambda h: _loss_on_logits(h[None], embeddings, labels[None],
                                             weights[None], 0.1))
    fused = peak(lambda h: fused_label_smoothed_nll(h, embeddings, labels, weights, 0.1,
                                                    chunk_elements=vocab * 64))
    assert unfused > logits_bytes
    assert fused < logits_bytes / 4


VOCAB = 40
ONE_LAYER = dict(num_layers=1)  # the tiny preset with one layer each side: faster traces


def _batch():
    source = np.zeros((6, 7), "int32")
    decoder_in = np.zeros((6, 5), "int32")
    labels = np.zeros((6, 5), "int32")
    for i in range(6):
        n, m = 2 + i % 5, 1 + (2 * i) % 5
        source[i, :n] = RNG.integers(4, VOCAB, n)
        target = RNG.integers(4, VOCAB, m)
        decoder_in[i, :m] = np.concatenate([[2], target[:-1]])
        labels[i, :m] = target
    return (source, decoder_in), labels


BATCH = _batch()


def _trainer(strategy, fused, optimizer=None, dropout=0.0, jit_compile=False):
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=dropout,
                                        **ONE_LAYER)
        model.build()
        optimizer = keras.optimizers.SGD(0.5) if optimizer is None else optimizer()
    return Trainer(model, optimizer, strategy, label_smoothing=0.1, fused_loss=fused,
                   jit_compile=jit_compile)


def test_decoder_output_is_the_logits_before_the_projection():
    trainer = _trainer(strategy_over(1), fused=True)
    (source, decoder_in), _ = BATCH
    model = trainer.model
    np.testing.assert_array_equal(
        model.embedding.logits(decoder_output(model, source, decoder_in, training=False)),
        model((source, decoder_in), training=False))


_PLAIN = {}


def _gradients(trainer):
    loss, grads = trainer.gradients(BATCH)
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in grads]


def _plain(replicas, jit_compile=False):
    """(loss, gradients) of BATCH with the loss on the logits (no fused loss, no R-Drop),
    computed once per module: the reference of the fused and R-Drop tests. _trainer seeds
    the weights, so they do not depend on which test asks first."""
    if (replicas, jit_compile) not in _PLAIN:
        _PLAIN[replicas, jit_compile] = _gradients(
            _trainer(strategy_over(replicas), False, jit_compile=jit_compile))
    return _PLAIN[replicas, jit_compile]


@pytest.mark.slow
@pytest.mark.parametrize("replicas, jit_compile", [(1, False), (2, False), (1, True)])
def test_trainer_fused_loss_same_loss_and_gradients(replicas, jit_compile):
    results = {False: _plain(replicas, jit_compile),
               True: _gradients(_trainer(strategy_over(replicas), True,
                                         jit_compile=jit_compile))}
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-6)
    for got, want in zip(results[True][1], results[False][1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_trainer_fused_loss_same_update_with_dropout_and_loss_scale():
    """Dropout draws the same masks on both paths (same layers in the same order), and a
    loss scale enters the token weights: the applied updates agree."""
    strategy = strategy_over(1)
    weights = {}
    for fused in (False, True):
        trainer = _trainer(strategy, fused, dropout=0.1, optimizer=lambda: (
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                                initial_scale=1024.0)))
        result = trainer.train_step(iter([BATCH]))
        assert result["finite"]
        weights[fused] = result["loss"], trainer.model.get_weights()
    assert weights[True][0] == pytest.approx(weights[False][0], rel=1e-6)
    for got, want in zip(weights[True][1], weights[False][1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_fused_loss_needs_a_tied_projection():
    strategy = strategy_over(1)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Embedding(VOCAB, 4), keras.layers.Dense(VOCAB)])
        model.build((None, None))
        optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="fused_loss=True needs a tfxformer Transformer"):
        Trainer(model, optimizer, strategy)


def _r_drop_trainer(strategy, r_drop, dropout):
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=dropout,
                                        **ONE_LAYER)
        model.build()
        optimizer = keras.optimizers.SGD(0.5)
    return Trainer(model, optimizer, strategy, label_smoothing=0.1, r_drop=r_drop)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_r_drop_without_dropout_is_the_plain_loss(replicas):
    """Two passes without dropout are equal: no KL, the mean of two equal losses."""
    plain_loss, plain_grads = _plain(replicas)
    loss, grads = _gradients(_r_drop_trainer(strategy_over(replicas), 5.0, dropout=0.0))
    assert loss == pytest.approx(plain_loss, rel=1e-5)
    for got, want in zip(grads, plain_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_r_drop_adds_the_kl_of_two_dropout_passes():
    """Same seed, same dropout masks: alpha 4 adds KL / tokens to the loss of alpha ~0."""
    strategy = strategy_over(1)
    small, _ = _r_drop_trainer(strategy, 1e-12, dropout=0.3).gradients(BATCH)
    large, _ = _r_drop_trainer(strategy, 4.0, dropout=0.3).gradients(BATCH)
    assert float(large) > float(small) + 1e-4
    with pytest.raises(ValueError, match="r_drop must be >= 0, got -1"):
        _r_drop_trainer(strategy, -1.0, dropout=0.0)
