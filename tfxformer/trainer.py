"""One training step on a distributed global batch, with exact global-token normalisation.

§5.1: "Each training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens." The loss of a step is the label-smoothed
cross-entropy averaged over the real target tokens of the whole global batch: every
replica divides its summed loss by the global token count (summed over replicas and over
the micro-batches of gradient accumulation) and the replicas' gradients are summed. So
1, 2 or 8 replicas, and one batch or the same tokens in several micro-batches, give the
same update.
"""

from __future__ import annotations

import contextlib
import os

import keras
import numpy as np
import tensorflow as tf

from tfxformer.layers.masks import PAD_ID
from tfxformer.losses import label_smoothed_nll

SUM = tf.distribute.ReduceOp.SUM
_IDS = tf.TensorSpec([None, None], tf.int32)
BATCH_SPEC = ((_IDS, _IDS), _IDS)  # ((source_ids, decoder_input_ids), labels), any B and L


class Trainer:
    """Builds the distributed train step for `model` and `optimizer` under `strategy`.

    Args:
        model: a tfxformer.Transformer built under `strategy.scope()`.
        optimizer: a Keras optimizer created under `strategy.scope()` (a
            LossScaleOptimizer under mixed_float16).
        strategy: the tf.distribute strategy.
        label_smoothing: ε_ls (§5.4).
        accumulation_steps: micro-batches whose gradients make one update.
        jit_compile: compile the replica computation with XLA.

    Batches are GLOBAL batches `((source_ids, decoder_input_ids), labels)` as
    tfxformer.data makes them (plain tensors, from a plain — checkpointable — tf.data
    iterator); inside the step each replica takes its contiguous slice of the batch. Every
    worker of a multi-worker run reads the same global batches and its replicas take their
    slices, so no replica ever sees a batch another one also trained on.
    """

    def __init__(self, model, optimizer, strategy, label_smoothing=0.1, accumulation_steps=1,
                 jit_compile=False):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}.")
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.label_smoothing = float(label_smoothing)
        self.accumulation_steps = int(accumulation_steps)
        with strategy.scope():  # variables are created here, not lazily inside a step
            if not model.built:
                model.build()
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
        self._grad_fn = tf.function(self._replica_gradients, jit_compile=jit_compile)
        # One trace for every length bucket: batch dimensions are left unknown.
        batches = [BATCH_SPEC] * self.accumulation_steps
        self._step_fn = tf.function(self._step, input_signature=[batches])
        self.eval_step = tf.function(self._eval_step, input_signature=[BATCH_SPEC])

    # --- replica functions ----------------------------------------------------------------

    @staticmethod
    def _replica_token_count(batch):
        _, labels = replica_slice(batch)
        return tf.reduce_sum(tf.cast(tf.not_equal(labels, PAD_ID), tf.float32))

    def _replica_gradients(self, batch, global_tokens):
        """(loss share, gradients of the loss share) of this replica's slice of `batch`."""
        (source, decoder_input), labels = replica_slice(batch)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model((source, decoder_input), training=True)
            loss_sum, _ = label_smoothed_nll(labels, logits, self.label_smoothing)
            loss = loss_sum / tf.maximum(global_tokens, 1.0)
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        return loss, grads

    def _replica_accumulate(self, batch, global_tokens, accumulated):
        loss, grads = self._grad_fn(batch, global_tokens)
        if accumulated is None:
            return loss, grads
        acc_loss, acc_grads = accumulated
        return acc_loss + loss, [a + g for a, g in zip(acc_grads, grads, strict=True)]

    def _replica_apply(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))

    @staticmethod
    def _replica_square_norm(grads):
        return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads])

    # --- steps -------------------------------------------------------------------------

    def _compute(self, batches):
        """Loss, real target tokens and summed gradients of a list of distributed batches."""
        tokens = tf.add_n([self.strategy.reduce(
            SUM, self.strategy.run(self._replica_token_count, args=(b,)), axis=None)
            for b in batches])
        accumulated = None
        for batch in batches:
            accumulated = self.strategy.run(self._replica_accumulate,
                                            args=(batch, tokens, accumulated))
        loss, grads = accumulated
        square_norm = self.strategy.reduce(
            SUM, self.strategy.run(self._replica_square_norm, args=(grads,)), axis=None)
        return self.strategy.reduce(SUM, loss, axis=None), tokens, square_norm, grads

    def _step(self, batches):
        """Computes the update and applies it only when loss and gradients are finite."""
        loss, tokens, square_norm, grads = self._compute(batches)
        finite = tf.math.is_finite(loss)
        if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            finite = tf.logical_and(finite, tf.math.is_finite(square_norm))

        def apply():
            self.strategy.run(self._replica_apply, args=(grads,))
            return tf.constant(True)
        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        return loss, tokens, applied

    def train_step(self, iterator):
        """One update from `accumulation_steps` global batches of `iterator`.

        Returns {"loss": mean loss per real target token (float), "tokens": real target
        tokens, "finite": whether loss and gradients were finite}. A non-finite step applies
        nothing: weights, optimizer state and step counter stay as they were. (Under
        mixed_float16 the loss-scale optimizer handles overflowing gradients itself.)
        """
        batches = [next(iterator) for _ in range(self.accumulation_steps)]
        loss, tokens, applied = self._step_fn(batches)
        return {"loss": float(loss), "tokens": float(tokens), "finite": bool(applied)}

    def gradients(self, batch):
        """(loss, gradients summed over replicas) of one global batch, without updating.

        The reference the replica-count tests compare; the same math as `train_step`.
        """
        @tf.function(input_signature=[BATCH_SPEC])
        def run(batch):
            tokens = self.strategy.reduce(
                SUM, self.strategy.run(self._replica_token_count, args=(batch,)), axis=None)
            loss, grads = self.strategy.run(self._grad_fn, args=(batch, tokens))
            return (self.strategy.reduce(SUM, loss, axis=None),
                    [self.strategy.reduce(SUM, g, axis=None) for g in grads])
        return run(batch)

    def _eval_step(self, batch):
        """(summed label-smoothed loss, summed plain NLL, real tokens) of one global batch."""
        def replica(batch):
            (source, decoder_input), labels = replica_slice(batch)
            logits = self.model((source, decoder_input), training=False)
            smoothed, count = label_smoothed_nll(labels, logits, self.label_smoothing)
            nll, _ = label_smoothed_nll(labels, logits, 0.0)
            return smoothed, nll, count
        results = self.strategy.run(replica, args=(batch,))
        return [self.strategy.reduce(SUM, r, axis=None) for r in results]


def replica_slice(batch):
    """This replica's contiguous share of a global batch (call in a replica context).

    Rows [i * n, (i + 1) * n) with n = ceil(B / R) for replica i of R; the last replicas'
    shares may be smaller (or empty) when B is not a multiple of R, which only happens for
    evaluation batches.
    """
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    if replicas == 1:
        return batch
    index = tf.cast(context.replica_id_in_sync_group, tf.int32)

    def part(t):
        rows = -(-tf.shape(t)[0] // replicas)
        return t[index * rows:(index + 1) * rows]
    return tf.nest.map_structure(part, batch)


# Fault injection for tests only: comma-separated update numbers whose first attempt the
# training loop runs inside `nan_embeddings`, so that loss and gradients are non-finite.
NONFINITE_FAULT_ENV = "TFXFORMER_FAULT_NONFINITE_STEPS"


def nonfinite_fault_steps() -> set[int]:
    """The update numbers that NONFINITE_FAULT_ENV asks to poison (empty when unset)."""
    raw = os.environ.get(NONFINITE_FAULT_ENV, "")
    try:
        return {int(part) for part in raw.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"{NONFINITE_FAULT_ENV}={raw!r}: expected comma-separated update "
                         "numbers, e.g. '7,12'.") from None


@contextlib.contextmanager
def nan_embeddings(model, active: bool = True):
    """Fault injection for tests: the shared embedding is NaN inside the block.

    A train step run inside it has a NaN loss and NaN gradients, so it exercises the
    non-finite path; the weights are put back afterwards (a skipped step changes none).
    """
    if not active:
        yield
        return
    variable = model.embedding.embeddings
    saved = keras.ops.convert_to_numpy(variable)
    variable.assign(np.full_like(saved, np.nan))
    try:
        yield
    finally:
        variable.assign(saved)


def learning_rate(optimizer) -> float:
    """The optimizer's current learning rate as a float (Keras evaluates the schedule)."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
