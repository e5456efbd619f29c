"""Positional encoding (§3.5)."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer import checks
from tfxformer.config import POSITION_EMBEDDINGS, ModelConfig

_MAX_POSITIONS = ModelConfig().max_positions  # a learned table's size unless told otherwise


def sinusoidal_encoding(positions, d_model: int) -> tf.Tensor:
    """(L,) positions -> (L, d_model) float32 encoding, sine and cosine interleaved.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
    """
    if d_model % 2:
        raise ValueError(f"The sinusoidal encoding needs an even d_model, got {d_model}.")
    positions = tf.cast(positions, tf.float32)[:, None]  # (L, 1)
    two_i = tf.range(0, d_model, 2, dtype=tf.float32)  # (D/2,)
    angles = positions / tf.pow(10000.0, two_i / d_model)  # (L, D/2)
    # stack on a new last axis, then flatten: [sin_0, cos_0, sin_1, cos_1, ...]
    pairs = tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1)  # (L, D/2, 2)
    return tf.reshape(pairs, [-1, d_model])


@keras.saving.register_keras_serializable(package="tfxformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to a sequence of embeddings (§3.5).

    "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))":
    sine on even dimensions, cosine on odd ones, interleaved (not `[sin | cos]` halves).
    The layer returns `inputs + PE` and nothing else: the sqrt(d_model) scaling belongs
    to the embedding (§3.4) and the dropout to the model (§5.4).

    `kind="learned"` selects learned position embeddings instead, the variant of Table 3
    row (E) ("nearly identical results"); it needs `max_positions`.

    Args:
        kind: "sinusoidal" (default) or "learned".
        max_positions: largest position + 1 a learned table holds (default 1024). The
            sinusoidal encoding is computed for any position and ignores it. (The
            config key was `max_length` before; `from_config` still accepts it.)

    Call arguments:
        inputs: (B, L, D) embeddings.
        start_index: position of the first element (int or scalar tensor; default 0),
            for incremental decoding.

    Returns:
        (B, L, D) tensor of the inputs' dtype.

    Example:
    >>> import tensorflow as tf
    >>> PositionalEncoding()(tf.zeros((1, 2, 4)))[0, 1].numpy().round(4)
    array([0.8415, 0.5403, 0.01  , 1.    ], dtype=float32)
    """

    def __init__(self, kind="sinusoidal", max_positions=_MAX_POSITIONS, **kwargs):
        super().__init__(**kwargs)
        if kind not in POSITION_EMBEDDINGS:
            raise ValueError(f"Unknown positional encoding kind {kind!r}; accepted: "
                             f"{POSITION_EMBEDDINGS}.")
        self.kind = kind
        self.max_positions = checks.integer(max_positions, "max_positions", 1)
        self.supports_masking = True  # position-wise: the input's Keras mask is the output's

    def build(self, input_shape):
        self.d_model = int(input_shape[-1])
        if self.kind == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"The sinusoidal encoding needs an even d_model, got {self.d_model}.")
        if self.kind == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings", shape=(self.max_positions, self.d_model),
                initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.built = True

    def call(self, inputs, start_index=0):
        length = tf.shape(inputs)[1]
        positions = tf.range(length) + tf.cast(start_index, tf.int32)
        if self.kind == "sinusoidal":
            encoding = sinusoidal_encoding(positions, self.d_model)
        else:
            encoding = tf.gather(self.position_embeddings, positions)
        return inputs + tf.cast(encoding, inputs.dtype)[None]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(kind=self.kind, max_positions=self.max_positions)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "max_length" in config:  # the name in .keras files of earlier versions
            config["max_positions"] = config.pop("max_length")
        return cls(**config)
