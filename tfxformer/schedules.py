"""The learning-rate schedule of §5.3 and the paper's Adam settings."""

from __future__ import annotations

import keras
import tensorflow as tf

ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON = 0.9, 0.98, 1e-9  # §5.3


@keras.saving.register_keras_serializable(package="tfxformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5) (§5.3, Eq. 3).

    "This corresponds to increasing the learning rate linearly for the first warmup_steps
    training steps, and decreasing it thereafter proportionally to the inverse square root
    of the step number. We used warmup_steps = 4000."

    Keras calls a schedule with the number of updates already applied (0 for the first
    update); step 0 is treated as step 1 so that the first update is not wasted.

    Args:
        d_model: model width (512 for base).
        warmup_steps: linear warmup length (4000).
        scale: extra factor on the whole schedule (1.0 = the paper).

    Example:
    >>> float(TransformerSchedule(512)(4000))  # the peak, 512^-0.5 * 4000^-0.5
    0.000698771...
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if int(d_model) < 1 or int(warmup_steps) < 1 or float(scale) <= 0:
            raise ValueError("TransformerSchedule needs d_model >= 1, warmup_steps >= 1 and "
                             f"scale > 0; got {d_model}, {warmup_steps}, {scale}.")
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        step = tf.maximum(tf.cast(step, tf.float32), 1.0)
        return (self.scale * self.d_model ** -0.5
                * tf.minimum(tf.math.rsqrt(step), step * self.warmup_steps ** -1.5))

    def get_config(self):
        return dict(d_model=self.d_model, warmup_steps=self.warmup_steps, scale=self.scale)


def paper_adam(learning_rate, **kwargs) -> keras.optimizers.Adam:
    """Adam with the paper's β1 = 0.9, β2 = 0.98, ε = 1e-9 (§5.3)."""
    return keras.optimizers.Adam(learning_rate=learning_rate, beta_1=ADAM_BETA_1,
                                 beta_2=ADAM_BETA_2, epsilon=ADAM_EPSILON, **kwargs)
