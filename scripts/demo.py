"""A small forward pass and `model.fit` demo of tfxformer.Transformer on toy data.

Usage: python scripts/demo.py [--preset tiny] [--steps 50]
"""

import argparse

import keras
import numpy as np
import tensorflow as tf

from tfxformer import Transformer
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.metrics import MaskedTokenAccuracy
from tfxformer.schedules import TransformerSchedule, paper_adam


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", help="model preset (default: tiny)")
    parser.add_argument("--steps", type=int, default=50, help="training steps (default: 50)")
    args = parser.parse_args()

    # Toy task: copy a random sequence of ids 4..63 (ids 0-3 are pad/unk/bos/eos).
    rng = np.random.default_rng(0)
    source = rng.integers(4, 64, size=(512, 10)).astype("int32")
    source[:, -1] = 3
    decoder_in = np.concatenate([np.full((512, 1), 2, "int32"), source[:, :-1]], 1)
    data = tf.data.Dataset.from_tensor_slices(((source, decoder_in), source)).batch(32).repeat()

    model = Transformer.from_preset(args.preset, vocab_size=64)
    model.compile(optimizer=paper_adam(TransformerSchedule(model.model_config.d_model,
                                                           warmup_steps=100, scale=2.0)),
                  loss=LabelSmoothedCrossEntropy(0.1), metrics=[MaskedTokenAccuracy()])
    model.fit(data, steps_per_epoch=args.steps, epochs=1)
    model.summary()


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    main()
