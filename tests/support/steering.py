"""What the steering tests share (test_steering.py, test_constraints.py,
test_token_log_probs.py): source sentences and the inputs of the `translate_nbest`
signature."""

import re

import tensorflow as tf

SOURCES = ["A dog runs in the park.", "Two men are talking.", "", "A woman sings.",
           "The children play football on the green field."]


def nbest_inputs(size, beam_size=3, num_hypotheses=3, alpha=0.6, extra_length=4,
                 max_input_tokens=48, no_repeat_ngram_size=0, repetition_penalty=1.0,
                 target_prefix="", constraints=""):
    """The per-text inputs of `translate_nbest` after `text`, each (size,) (a list gives
    one value per text); the steering options off by default."""
    values = dict(beam_size=(beam_size, tf.int32), alpha=(alpha, tf.float32),
                  extra_length=(extra_length, tf.int32),
                  max_input_tokens=(max_input_tokens, tf.int32),
                  num_hypotheses=(num_hypotheses, tf.int32),
                  no_repeat_ngram_size=(no_repeat_ngram_size, tf.int32),
                  repetition_penalty=(repetition_penalty, tf.float32),
                  target_prefix=(target_prefix, tf.string),
                  constraints=(constraints, tf.string))
    return {name: tf.broadcast_to(tf.constant(value, dtype), [size])
            for name, (value, dtype) in values.items()}


def cleaned(text):
    """An output as an export writes it (tfxformer/serving/reading.py): C0 controls out,
    "\u2047" (the unknown piece) and a space beside it out."""
    text = re.sub(r"[\x00-\x1f]", "", text)
    return re.sub(r"^ | $", "", re.sub(" ?\u2047 ?", " ", text)) if "\u2047" in text else text
