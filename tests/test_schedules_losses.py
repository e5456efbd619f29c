"""§5.3 schedule and Adam, §5.4 label smoothing, masked accuracy: pinned numbers."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

from tfxformer.losses import LabelSmoothedCrossEntropy
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
