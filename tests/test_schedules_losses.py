"""§5.3 schedule and Adam, §5.4 label smoothing, masked accuracy: pinned numbers."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

from tfxformer.losses import LabelSmoothedCrossEntropy, r_drop_label_smoothed_nll
from tfxformer.metrics import MaskedTokenAccuracy
from tfxformer.schedules import TransformerSchedule, paper_adam


@pytest.mark.parametrize("step, expected", [
    (1, 512 ** -0.5 * 4000 ** -1.5),      # warmup: step * warmup^-1.5
    (4000, 512 ** -0.5 * 4000 ** -0.5),   # the peak, 6.988e-4
    (16000, 512 ** -0.5 * 16000 ** -0.5),  # decay: step^-0.5
])
def test_schedule_values_pinned(step, expected):
    assert float(TransformerSchedule(512)(step)) == pytest.approx(expected, rel=1e-6)


def test_schedule_numbers():
    assert float(TransformerSchedule(512)(4000)) == pytest.approx(6.9877e-4, rel=1e-4)
    assert float(TransformerSchedule(512)(0)) == float(TransformerSchedule(512)(1))
    assert float(TransformerSchedule(512, scale=2.0)(100)) == pytest.approx(
        2 * float(TransformerSchedule(512)(100)))


def test_schedule_and_optimizer_serialize():
    schedule = TransformerSchedule(1024, warmup_steps=8000, scale=0.5)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert clone.get_config() == schedule.get_config()
    optimizer = paper_adam(schedule)
    restored = keras.optimizers.Adam.from_config(optimizer.get_config())
    assert (restored.beta_1, restored.beta_2, restored.epsilon) == (0.9, 0.98, 1e-9)
    assert isinstance(restored._learning_rate, TransformerSchedule)
    assert restored._learning_rate.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="warmup_steps"):
        TransformerSchedule(512, warmup_steps=0)


def test_label_smoothed_loss_toy_case_ignores_padding():
    # One real token with label 1 and probabilities [0.2, 0.5, 0.3]; a pad position.
    probs = np.array([[[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]], "float32")
    labels = tf.constant([[1, 0]])
    eps = 0.1
    expected = (1 - eps) * -np.log(0.5) + eps * -np.log(probs[0, 0]).mean()
    loss = LabelSmoothedCrossEntropy(eps)(labels, tf.math.log(probs))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(LabelSmoothedCrossEntropy(0.0)(labels, tf.math.log(probs))) == pytest.approx(
        -np.log(0.5), rel=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        LabelSmoothedCrossEntropy(1.5)
    clone = LabelSmoothedCrossEntropy.from_config(LabelSmoothedCrossEntropy(0.2).get_config())
    assert clone.label_smoothing == 0.2


def test_keras_fit_loss_is_normalised_by_global_tokens():
    """Under MirroredStrategy, `model.fit` with the loss reports the global token mean."""
    labels = np.array([[1, 2, 0, 0], [1, 0, 0, 0], [2, 2, 2, 1], [1, 1, 0, 0]], "int32")
    logits = np.random.default_rng(0).normal(size=(4, 4, 3)).astype("float32")
    expected = float(LabelSmoothedCrossEntropy(0.1)(labels, logits))

    class Fixed(keras.Model):
        def __init__(self):
            super().__init__()
            self.bias = self.add_weight(shape=(3,), initializer="zeros")

        def call(self, x):
            return x + self.bias

    with strategy_over(2).scope():
        model = Fixed()
        model.compile(optimizer=keras.optimizers.SGD(0.0), loss=LabelSmoothedCrossEntropy(0.1))
    data = tf.data.Dataset.from_tensors((logits, labels))
    assert model.evaluate(data, verbose=0) == pytest.approx(expected, rel=1e-5)


def test_masked_token_accuracy():
    metric = MaskedTokenAccuracy()
    metric.update_state(tf.constant([[1, 2, 0]]), tf.one_hot([[1, 3, 3]], 4))
    metric.update_state(tf.constant([[3, 0, 0]]), tf.one_hot([[3, 0, 0]], 4))
    assert float(metric.result()) == pytest.approx(2 / 3)


def test_r_drop_loss_equals_the_formula_on_a_toy_batch():
    """Half the paper's loss: (NLL_a + NLL_b) / 2 + α (KL(a||b) + KL(b||a)) / 4, real tokens."""
    labels = np.array([[1, 2, 0]])
    rng = np.random.default_rng(0)
    logits_a, logits_b = rng.normal(size=(2, 1, 3, 4)).astype("float32")
    eps, alpha = 0.1, 5.0

    def log_softmax(x):
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    la, lb = log_softmax(logits_a[0]), log_softmax(logits_b[0])
    expected = 0.0
    for t in range(2):  # the third token is padding
        nll = [-(1 - eps) * lp[t, labels[0, t]] - eps * lp[t].mean() for lp in (la, lb)]
        kl_ab = (np.exp(la[t]) * (la[t] - lb[t])).sum()
        kl_ba = (np.exp(lb[t]) * (lb[t] - la[t])).sum()
        expected += (nll[0] + nll[1]) / 2 + alpha * (kl_ab + kl_ba) / 4
    total, tokens = r_drop_label_smoothed_nll(labels, logits_a, logits_b, eps, alpha)
    assert float(tokens) == 2.0
    assert float(total) == pytest.approx(expected, rel=1e-5)
    # alpha 0 and equal passes: the ordinary summed loss
    plain = LabelSmoothedCrossEntropy(eps, reduction="sum")(labels, logits_a)
    same, _ = r_drop_label_smoothed_nll(labels, logits_a, logits_a, eps, 0.0)
    assert float(same) == pytest.approx(float(plain), rel=1e-6)
    # identical passes have no KL, whatever alpha
    same_kl, _ = r_drop_label_smoothed_nll(labels, logits_a, logits_a, eps, alpha)
    assert float(same_kl) == pytest.approx(float(plain), rel=1e-6)
