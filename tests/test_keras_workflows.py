"""Keras workflows as a Keras user hits them: sample weights in the
loss, `model.quantize("int8")` -> `.keras` save -> load, `model.export` with int32 ids."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

from tfxformer import Transformer
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.metrics import MaskedTokenAccuracy

EPS = 0.1
LABELS = np.array([[5, 6, 7, 0], [8, 9, 0, 0], [4, 4, 4, 4]], "int32")


def _logits(seed=0, vocab=12):
    return np.random.default_rng(seed).normal(size=LABELS.shape + (vocab,)).astype("float32")


def _per_token(labels, logits):
    """Hand-computed label-smoothed cross-entropy per token, numpy, 0 at pads."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    return ((1 - EPS) * nll + EPS * -log_probs.mean(-1)) * (labels != 0)


def test_weighted_loss_equals_hand_computed_value():
    logits = _logits()
    token = _per_token(LABELS, logits)
    real = (LABELS != 0).astype("float32")
    weights = np.array([2.0, 0.0, 0.5], "float32")
    w = weights[:, None] * real
    loss = LabelSmoothedCrossEntropy(EPS)
    assert float(loss(LABELS, logits, sample_weight=weights)) == pytest.approx(
        (token * w).sum() / real.sum(), rel=1e-5)
    weighted_mean = LabelSmoothedCrossEntropy(EPS, reduction="mean_with_sample_weight")
    assert float(weighted_mean(LABELS, logits, sample_weight=weights)) == pytest.approx(
        (token * w).sum() / w.sum(), rel=1e-5)
    # An example of weight 0 does not count: the weighted mean without it is the same.
    keep = [0, 2]
    assert float(weighted_mean(LABELS, logits, sample_weight=weights)) == pytest.approx(
        float(weighted_mean(LABELS[keep], logits[keep], sample_weight=weights[keep])),
        rel=1e-5)
    # Per-token weights, "sum" and per-token (None) reductions.
    token_weights = np.random.default_rng(1).uniform(size=LABELS.shape).astype("float32")
    assert float(loss(LABELS, logits, sample_weight=token_weights)) == pytest.approx(
        (token * token_weights).sum() / real.sum(), rel=1e-5)
    summed = LabelSmoothedCrossEntropy(EPS, reduction="sum")
    assert float(summed(LABELS, logits, sample_weight=weights)) == pytest.approx(
        (token * w).sum(), rel=1e-5)
    per_token = LabelSmoothedCrossEntropy(EPS, reduction=None)(LABELS, logits)
    np.testing.assert_allclose(per_token.numpy(), token, rtol=1e-5, atol=1e-6)
    # Unweighted, it is still the paper's mean over real target tokens.
    assert float(loss(LABELS, logits)) == pytest.approx(token.sum() / real.sum(), rel=1e-5)
    with pytest.raises(ValueError, match="sample_weight"):
        loss(LABELS, logits, sample_weight=np.ones((3, 4, 1, 1), "float32"))


def test_weighted_token_accuracy():
    metric = MaskedTokenAccuracy()
    # Example 0: 1 of 2 real tokens right; example 1 (weight 0): 1 of 1 right.
    metric.update_state(tf.constant([[1, 2, 0], [3, 0, 0]]), tf.one_hot([[1, 3, 3], [3, 0, 0]], 4),
                        sample_weight=tf.constant([1.0, 0.0]))
    assert float(metric.result()) == pytest.approx(0.5)


def _fixed_logits_model(strategy=None):
    class Fixed(keras.Model):  # logits in, logits out (+ a zero bias): a loss probe
        def __init__(self):
            super().__init__()
            self.bias = self.add_weight(shape=(12,), initializer="zeros")

        def call(self, x):
            return x + self.bias

    with (strategy or tf.distribute.get_strategy()).scope():
        model = Fixed()
        model.compile(optimizer=keras.optimizers.SGD(0.0),
                      loss=LabelSmoothedCrossEntropy(EPS, reduction="mean_with_sample_weight"))
    return model


def test_weighted_loss_is_global_under_mirrored_strategy():
    logits = _logits()
    labels = np.concatenate([LABELS, LABELS[:1]])  # 4 examples, 2 per replica
    logits = np.concatenate([logits, logits[:1]])
    weights = np.array([1.0, 0.0, 3.0, 0.5], "float32")
    w = weights[:, None] * (labels != 0)
    expected = (_per_token(labels, logits) * w).sum() / w.sum()
    data = tf.data.Dataset.from_tensors((logits, labels, weights))
    single = _fixed_logits_model().evaluate(data, verbose=0)
    mirrored = _fixed_logits_model(strategy_over(2)).evaluate(data, verbose=0)
    assert single == pytest.approx(expected, rel=1e-5)
    assert mirrored == pytest.approx(expected, rel=1e-5)


def _tiny(vocab=40, **overrides):
    return Transformer.from_preset("tiny", vocab_size=vocab, dropout=0.0, **overrides)


def _seq2seq_batch():
    source = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3], [12, 3, 0, 0, 0]], "int32")
    target = np.array([[13, 14, 3, 0], [15, 3, 0, 0], [16, 17, 18, 3]], "int32")
    decoder_in = np.concatenate([np.full((3, 1), 2, "int32"), target[:, :-1]], axis=1)
    return source, decoder_in * (target != 0), target


def _one_sgd_step(source, decoder_in, target, sample_weight=None):
    keras.utils.set_random_seed(7)
    model = _tiny()
    # Eager: the claim is Keras' weighting of the loss, metric and update, which is the
    # same code in a graph (tracing the train step costs ~10 s per fit on 2 cores).
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=LabelSmoothedCrossEntropy(EPS, reduction="mean_with_sample_weight"),
                  weighted_metrics=[MaskedTokenAccuracy()], run_eagerly=True)
    history = model.fit((source, decoder_in), target, sample_weight=sample_weight,
                        batch_size=len(source), epochs=1, shuffle=False, verbose=0)
    return model, history.history


@pytest.mark.slow
def test_fit_with_sample_weights_ignores_a_weight_zero_example():
    source, decoder_in, target = _seq2seq_batch()
    weighted, history = _one_sgd_step(source, decoder_in, target,
                                      sample_weight=np.array([1.0, 0.0, 1.0], "float32"))
    keep = [0, 2]
    alone, alone_history = _one_sgd_step(source[keep], decoder_in[keep], target[keep])
    assert history["loss"][0] == pytest.approx(alone_history["loss"][0], rel=1e-5)
    assert history["token_accuracy"][0] == pytest.approx(
        alone_history["token_accuracy"][0], rel=1e-6)
    for a, b in zip(weighted.trainable_weights, alone.trainable_weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    unweighted, _ = _one_sgd_step(source, decoder_in, target)
    assert not np.allclose(unweighted.trainable_weights[0].numpy(),
                           alone.trainable_weights[0].numpy())


@pytest.fixture
def frozen_heap():
    """Keras runs a full gc.collect() for every variable a quantized layer drops (its float
    kernel: Layer.__delattr__), on quantize and again on load; in a worker whose heap holds
    the earlier tests' graphs each one takes seconds. Freezing the objects alive before the
    test leaves those collections only this test's objects to scan (nothing else changes)."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.slow
def test_quantize_save_load_gives_the_same_outputs(tmp_path, frozen_heap):
    source, decoder_in, _ = _seq2seq_batch()
    model = _tiny()
    model((source, decoder_in))
    model.quantize("int8")
    int8 = sorted(w.path for w in model.weights if w.dtype == "int8")
    assert int8 and all("feed_forward" in path for path in int8)
    expected = model((source, decoder_in)).numpy()
    model.save(tmp_path / "q.keras")
    loaded = keras.models.load_model(tmp_path / "q.keras")
    assert sorted(w.path for w in loaded.weights if w.dtype == "int8") == int8
    np.testing.assert_array_equal(loaded((source, decoder_in)).numpy(), expected)
    loaded.save(tmp_path / "again.keras")  # a loaded quantized model saves again
    again = keras.models.load_model(tmp_path / "again.keras")
    np.testing.assert_array_equal(again((source, decoder_in)).numpy(), expected)
    # An unquantized model's config is unchanged (a plain dtype policy, no map).
    assert _tiny().get_config()["dtype"]["class_name"] == "DTypePolicy"


def test_quantized_config_from_another_model_is_refused(frozen_heap):
    model = _tiny()
    model.build()
    model.quantize("int8")
    config = model.get_config()
    config["num_layers"] = 1  # layer_1's feed-forward no longer exists
    with pytest.raises(ValueError, match="layer_1/feed_forward"):
        Transformer.from_config(config).build()


@pytest.mark.slow
def test_export_reload_call_with_int32_ids_of_new_lengths(tmp_path):
    source, decoder_in, _ = _seq2seq_batch()
    model = _tiny(num_layers=1)  # one layer per stack: half the graph to trace and save
    model((source, decoder_in))  # first call: lengths 5 and 4
    model.export(str(tmp_path / "export"), verbose=False)
    reloaded = tf.saved_model.load(str(tmp_path / "export"))
    new_source = tf.constant([[5, 6, 7, 8, 9, 10, 3], [11, 3, 0, 0, 0, 0, 0]], tf.int32)
    new_target = tf.constant([[2, 13, 14, 15, 16, 17], [2, 18, 0, 0, 0, 0]], tf.int32)
    logits = reloaded.serve((new_source, new_target))
    assert logits.dtype == tf.float32 and logits.shape == (2, 6, 40)
    np.testing.assert_allclose(logits.numpy(), model((new_source, new_target)).numpy(),
                               rtol=1e-5, atol=1e-5)
    serving = reloaded.signatures["serving_default"]
    outputs = serving(source_ids=new_source, target_ids=new_target)
    np.testing.assert_allclose(next(iter(outputs.values())).numpy(), logits.numpy())
