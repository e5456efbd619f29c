"""What the decoding tests share (test_decoding.py, test_stopping.py, test_sampling.py,
test_scoring.py): a step function with forced log-probabilities and its toy tables."""

import numpy as np
import tensorflow as tf

from tfxformer.decoding import BOS_ID, EOS_ID, DecodeStart
from tfxformer.decoding.adapter import output_limits

VOCAB = 40


class BigramStub:
    """A step function with forced log-probabilities: the next token depends on the last
    one only, and from position `stop` of a sentence (its source's first id) EOS gets
    `stop_bonus` more logit. `table[prev] = {token: probability}`; missing entries get
    probability ~0. Records the rows of every step (eager mode)."""

    def __init__(self, table, vocab_size=8, max_length=64, stop_bonus=0.0):
        probs = np.full((vocab_size, vocab_size), 1e-12)
        for prev, row in table.items():
            for token, p in row.items():
                probs[prev, token] = p
        probs /= probs.sum(axis=1, keepdims=True)
        self.log_probs = tf.constant(np.log(probs), tf.float32)
        self.max_length, self.stop_bonus = max_length, stop_bonus
        self.rows = []  # rows of each step_fn call

    @property
    def steps(self):
        return len(self.rows)

    def start(self, source_ids, beams=1, extra_length=50, static_cache=False):
        source_ids = tf.convert_to_tensor(source_ids)
        mask = tf.not_equal(source_ids, 0)
        limits, length = output_limits(mask, self.max_length, extra_length)
        batch = tf.shape(source_ids)[0]
        cache = {"rows": tf.zeros([batch * beams, 1])}  # per hypothesis, never read

        def step_fn(ids, index, cache, context):
            self.rows.append(int(ids.shape[0]) if ids.shape[0] is not None else None)
            stop = tf.repeat(context["stop"], tf.shape(ids)[0] // tf.shape(context["stop"])[0])
            bonus = tf.where(index >= stop, self.stop_bonus, 0.0)[:, None]
            eos = tf.one_hot(EOS_ID, self.log_probs.shape[0])[None]
            return tf.gather(self.log_probs, ids[:, -1]) + bonus * eos, cache

        return DecodeStart(step_fn, cache, {"stop": source_ids[:, 0]}, limits, length)


def hypothesis_ids(ids, lengths):
    """Each row's ids up to its length, as lists."""
    return [row[:n].tolist() for row, n in zip(ids.numpy(), lengths.numpy(), strict=True)]


# BOS -> EOS 0.3 | a 0.6 | b 0.1;  a -> EOS 0.45 | a 0.55;  b -> EOS 0.5 | b 0.5
A, B = 4, 5
PENALTY_TABLE = {BOS_ID: {EOS_ID: 0.3, A: 0.6, B: 0.1}, A: {EOS_ID: 0.45, A: 0.55},
                 B: {EOS_ID: 0.5, B: 0.5}}
