"""The keras-hub peer of the training benchmark, built as the peers' `train_kerashub.py`.

One tied keras_hub.layers.ReversibleEmbedding shared by source, target and the pre-softmax
projection, embeddings scaled by sqrt(d) plus SinePositionEncoding and dropout; N
TransformerEncoder and N TransformerDecoder layers (post-LN, ReLU, dropout 0.1, which
keras-hub also applies to the attention probabilities); a label-smoothed (0.1) cross-entropy
written with keras.ops; Adam(schedule, 0.9, 0.98, 1e-9) with the warmup-4000 inverse-sqrt
schedule; one `model.train_on_batch` per step. Sizes follow the tfxformer preset.
"""

from __future__ import annotations

import math

import keras
from keras import ops

PAD = 0


class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, d_model, warmup=4000):
        self.d_model, self.warmup = d_model, warmup

    def __call__(self, step):
        s = ops.cast(step, "float32") + 1.0
        return self.d_model ** -0.5 * ops.minimum(ops.rsqrt(s), s * self.warmup ** -1.5)


def label_smoothed_ce(y_true, y_pred, eps=0.1):
    logp = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
    y = ops.expand_dims(ops.cast(y_true, "int32"), -1)
    nll = -ops.squeeze(ops.take_along_axis(logp, y, axis=-1), -1)
    smooth = -ops.mean(logp, axis=-1)
    return (1.0 - eps) * nll + eps * smooth


def build_model(vocab_size, d_model, num_heads, d_ff, num_layers, dropout=0.1):
    import keras_hub

    src = keras.Input((None,), dtype="int32", name="src")
    tgt_in = keras.Input((None,), dtype="int32", name="tgt_in")
    emb = keras_hub.layers.ReversibleEmbedding(
        vocab_size, d_model, tie_weights=True,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=d_model ** -0.5),
        name="shared_embedding")
    pos = keras_hub.layers.SinePositionEncoding(name="sine_pos")

    def embed(ids, name):
        x = emb(ids) * math.sqrt(d_model)
        x = x + pos(x)
        return keras.layers.Dropout(dropout, name=f"{name}_emb_dropout")(x)

    enc_mask = ops.not_equal(src, PAD)
    dec_mask = ops.not_equal(tgt_in, PAD)
    x = embed(src, "enc")
    for i in range(num_layers):
        x = keras_hub.layers.TransformerEncoder(
            d_ff, num_heads, dropout=dropout, activation="relu", normalize_first=False,
            name=f"enc_{i}")(x, padding_mask=enc_mask)
    y = embed(tgt_in, "dec")
    for i in range(num_layers):
        y = keras_hub.layers.TransformerDecoder(
            d_ff, num_heads, dropout=dropout, activation="relu", normalize_first=False,
            name=f"dec_{i}")(y, x, decoder_padding_mask=dec_mask, encoder_padding_mask=enc_mask)
    logits = emb(y, reverse=True)
    return keras.Model([src, tgt_in], logits, name="kerashub_transformer")


def make_train_step(config: dict):
    """(model, step) where step(src, tgt_in, tgt) runs one optimizer step, returns the loss."""
    import keras_hub

    keras.utils.set_random_seed(0)
    model = build_model(config["vocab_size"], config["d_model"], config["num_heads"],
                        config["d_ff"], config["num_layers"], config["dropout"])
    model.compile(optimizer=keras.optimizers.Adam(InverseSqrtSchedule(config["d_model"]),
                                                  beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss=label_smoothed_ce, jit_compile=False)

    def step(src, tgt_in, tgt):
        weights = (tgt != PAD).astype("float32")
        return float(model.train_on_batch([src.astype("int32"), tgt_in.astype("int32")],
                                          tgt.astype("int32"), sample_weight=weights))

    model.peer_name = f"keras-hub {keras_hub.__version__} layers, train_on_batch"
    return model, step
