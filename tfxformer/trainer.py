"""One training step on a distributed global batch, with exact global-token normalisation.

§5.1: "Each training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens." The loss of a step is the label-smoothed
cross-entropy averaged over the real target tokens of the whole global batch: every
replica divides its summed loss by the global token count (summed over replicas and over
the micro-batches of gradient accumulation) and the replicas' gradients are summed. So
1, 2 or 8 replicas, and one batch or the same tokens in several micro-batches, give the
same update.

Several updates per call: :class:`UpdateLoop` (:meth:`Trainer.loop`) runs N updates in one
`tf.function` call, reading their global batches from the tf.data iterator inside the
graph, as Orbit's `steps_per_loop` and Keras' `steps_per_execution` do; each update is
:meth:`Trainer._step`, the same function the one-update path calls.

No host sync per step: :meth:`Trainer.step` returns device tensors (loss, tokens, whether
the update was applied, its update number) that the training loop reads once per log
interval; the non-finite check, the halt after too many non-finite updates, and the
test-only fault injection all run on the device. The one-update path takes its batches
from a :class:`DeviceFeed`, which prefetches each replica's share onto its device; the
training loop uses :class:`UpdateLoop`.
"""

from __future__ import annotations

import collections

import keras
import tensorflow as tf

from tfxformer.ids import PAD_ID
from tfxformer.layers.attention import head_average
from tfxformer.losses import (
    FUSED_CHUNK_ELEMENTS,
    fused_label_smoothed_nll,
    guided_alignment_nll,
    label_smoothed_nll,
    r_drop_label_smoothed_nll,
)

__all__ = ["DeviceFeed", "Trainer", "decoder_output"]

SUM = tf.distribute.ReduceOp.SUM
_IDS = tf.TensorSpec([None, None], tf.int32)
BATCH_SPEC = ((_IDS, _IDS), _IDS)  # ((source_ids, decoder_input_ids), labels), any B and L
_LINKS = tf.TensorSpec([None, None, None], tf.float32)  # guided alignment's (B, L, L)


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
        halt_after_nonfinite: after this many non-finite updates in a row no update is
            applied any more (on the device, so nothing after the stop point trains
            before the host reads the results); None: never halt.
        nonfinite_fault_steps: test-only fault injection: the first attempt of each of
            these update numbers gets a NaN loss and NaN gradients.
        fused_loss: compute the tied output projection and the loss together in chunks of
            rows (:func:`tfxformer.losses.fused_label_smoothed_nll`), never holding the
            (B, T, V) logits: the same loss and gradients as the loss on the logits
            (False), at a lower peak memory (bench/README.md, "Training memory"). With
            jit_compile the rows are one chunk (XLA plans the buffers).
        r_drop: R-Drop's α (:func:`tfxformer.losses.r_drop_label_smoothed_nll`): each
            replica batch runs twice (as one batch of twice the rows, each copy with its
            own dropout masks) and the loss adds the symmetric KL between the two passes'
            predictions; 0 (default) = the paper's loss. Needs the full logits: R-Drop
            steps do not use the fused loss.
        alignment_weight: guided alignment's λ (Garg et al., 2019;
            :func:`tfxformer.losses.guided_alignment_nll`): the batches carry (B, L, L)
            piece links as a third element, and the loss adds λ times the cross-entropy
            of the model's alignment attention (its `alignment_layer`, averaged over its
            first `alignment_heads` heads, :class:`tfxformer.config.ModelConfig`) against
            them, normalised as the translation loss is; 0 (default): off. Not with R-Drop.

    Batches are GLOBAL batches `((source_ids, decoder_input_ids), labels)` as
    tfxformer.data makes them (`((source_ids, decoder_input_ids), labels, links)` with
    guided alignment). :meth:`feed` wraps a plain (checkpointable) tf.data iterator
    of them; it hands each replica its contiguous slice, on the replica's device. Every
    worker of a multi-worker run reads the same global batches and its replicas take their
    slices, so no replica ever sees a batch another one also trained on.
    """

    def __init__(self, model, optimizer, strategy, label_smoothing=0.1, accumulation_steps=1,
                 jit_compile=False, halt_after_nonfinite=None, nonfinite_fault_steps=(),
                 fused_loss=True, r_drop=0.0, alignment_weight=0.0):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}.")
        if halt_after_nonfinite is not None and halt_after_nonfinite < 1:
            raise ValueError(f"halt_after_nonfinite must be >= 1 or None, got "
                             f"{halt_after_nonfinite}.")
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.label_smoothing = float(label_smoothing)
        self.accumulation_steps = int(accumulation_steps)
        if float(r_drop) < 0:
            raise ValueError(f"r_drop must be >= 0, got {r_drop}.")
        self.r_drop = float(r_drop)
        if float(alignment_weight) < 0 or (alignment_weight and self.r_drop):
            raise ValueError(f"alignment_weight must be >= 0 and goes without R-Drop, got "
                             f"{alignment_weight} (r_drop {r_drop}).")
        self.alignment_weight = float(alignment_weight)
        # one replica's batch: source, decoder input, labels (and links)
        self._batch_spec = BATCH_SPEC + (_LINKS,) if self.alignment_weight else BATCH_SPEC
        self._tensors = len(tf.nest.flatten(self._batch_spec))
        self.fused_loss = bool(fused_loss) and not self.r_drop
        # XLA: one chunk, no loop (see fused_label_smoothed_nll's chunk_elements).
        self._chunk_elements = None if jit_compile else FUSED_CHUNK_ELEMENTS
        if self.fused_loss and not _has_tied_projection(model):
            raise ValueError(f"fused_loss=True needs a tfxformer Transformer (encode, embed, "
                             f"decoder, embedding.embeddings); got {type(model).__name__}. "
                             "Pass fused_loss=False to train on the model's logits.")
        with strategy.scope():  # variables are created here, not lazily inside a step
            if not model.built:
                model.build()
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
        with tf.device("/cpu:0"):  # small control state, read by the host without a copy
            self._in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False)
            self._poisoned = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._halt_after = tf.constant(halt_after_nonfinite or 2 ** 62, tf.int64)
        faults = sorted({int(s) for s in nonfinite_fault_steps})
        self._faults = tf.constant(faults, tf.int64, shape=[len(faults)])
        self.traces = 0  # traces of the step function (one per run: any bucket shape)
        # Graph code throughout (tf.cond, tf.while_loop): traced without AutoGraph, which
        # would convert every Keras call it reaches, seconds per trace.
        self._grad_fn = tf.function(self._replica_gradients, jit_compile=jit_compile,
                                    autograph=False)
        self._local = len(strategy.extended.worker_devices)
        # Flat per-replica tensors (cheapest to pass): [batch][local replica][tensors].
        flat = tf.nest.flatten(self._batch_spec) * (self._local * self.accumulation_steps)
        self._step_fn = tf.function(self._step_flat, input_signature=[flat], autograph=False)
        self._concrete = None
        self._update_loop = None
        self.eval_step = tf.function(self._eval_step, input_signature=[BATCH_SPEC],
                                     autograph=False)

    # --- replica functions ----------------------------------------------------------------

    @staticmethod
    def _replica_token_count(batch):
        return tf.reduce_sum(tf.cast(tf.not_equal(batch[1], PAD_ID), tf.float32))

    def _replica_gradients(self, batch, global_tokens, poison):
        """(loss share, gradients of the loss share) of this replica's `batch`."""
        (source, decoder_input), labels, *links = batch
        variables = self.model.trainable_variables
        norm = poison / tf.maximum(global_tokens, 1.0)
        with tf.GradientTape() as tape:
            if self.fused_loss:
                # Every factor goes into the token weights: the fused loss forms its logit
                # gradients in the forward pass, at their final scale (float16-safe).
                scale = tf.cast(self.optimizer.scale_loss(tf.constant(1.0)), tf.float32)
                mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
                hidden, aligned = self._decoder_output(source, decoder_input, links)
                scaled = fused_label_smoothed_nll(
                    hidden, self.model.embedding.embeddings, labels, mask * (norm * scale),
                    self.label_smoothing, self._chunk_elements)
                loss = scaled / scale
                if links:  # the alignment loss, scaled as the fused loss' tokens are
                    loss += aligned * norm
                    scaled += aligned * (norm * scale)
            else:
                loss = self._loss_sum_on_logits(source, decoder_input, labels, links) * norm
                scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        return loss, grads

    def _decoder_output(self, source, decoder_input, links):
        """((B, T, D) decoder output, λ times the summed alignment loss (None without
        `links`))."""
        if not links:
            return decoder_output(self.model, source, decoder_input), None
        hidden, weights = decoder_output(self.model, source, decoder_input,
                                         return_attention_scores=True)
        return hidden, self._alignment_loss(weights, links[0])

    def _alignment_loss(self, weights, links):
        """λ times the summed guided-alignment loss of the decoder's per-layer attention
        `weights` against `links`."""
        config = self.model.model_config
        attention = head_average(weights[config.alignment_layer]["cross"],
                                 config.alignment_heads)
        return self.alignment_weight * guided_alignment_nll(attention, links)[0]

    def _loss_sum_on_logits(self, source, decoder_input, labels, links=()):
        """Summed label-smoothed NLL on the model's logits (and λ times the alignment loss
        with `links`); with R-Drop, of two passes."""
        if links:
            memory, source_mask = self.model.encode(source, training=True)
            logits, weights = self.model.decode(decoder_input, memory, source_mask,
                                                training=True, return_attention_scores=True)
            return label_smoothed_nll(labels, logits, self.label_smoothing)[0] + \
                self._alignment_loss(weights, links[0])
        if not self.r_drop:
            logits = self.model((source, decoder_input), training=True)
            return label_smoothed_nll(labels, logits, self.label_smoothing)[0]
        twice = self.model((tf.concat([source, source], 0),
                            tf.concat([decoder_input, decoder_input], 0)), training=True)
        logits_a, logits_b = tf.split(twice, 2, axis=0)
        return r_drop_label_smoothed_nll(labels, logits_a, logits_b, self.label_smoothing,
                                         self.r_drop)[0]

    def _replica_accumulate(self, batch, global_tokens, poison, accumulated):
        loss, grads = self._grad_fn(batch, global_tokens, poison)
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

    def _compute(self, batches, poison):
        """Loss, real target tokens and summed gradients of a list of distributed batches."""
        tokens = tf.add_n([self.strategy.reduce(
            SUM, self.strategy.run(self._replica_token_count, args=(b,)), axis=None)
            for b in batches])
        accumulated = None
        for batch in batches:
            accumulated = self.strategy.run(self._replica_accumulate,
                                            args=(batch, tokens, poison, accumulated))
        loss, grads = accumulated
        square_norm = self.strategy.reduce(
            SUM, self.strategy.run(self._replica_square_norm, args=(grads,)), axis=None)
        return self.strategy.reduce(SUM, loss, axis=None), tokens, square_norm, grads

    def _fault(self, update):
        """NaN for the first attempt of a fault-injection update number, else 1."""
        hit = tf.logical_and(tf.reduce_any(tf.equal(self._faults, update)),
                             update > self._poisoned)
        self._poisoned.assign(tf.where(hit, update, self._poisoned))
        return tf.where(hit, tf.constant(float("nan")), tf.constant(1.0))

    def _step_flat(self, flat):
        """`_step` on DeviceFeed's flat list of per-replica tensors."""
        self.traces += 1
        per_batch = self._tensors * self._local
        batches = []
        for start in range(0, len(flat), per_batch):
            parts = flat[start:start + per_batch]

            def value_fn(context, parts=parts):
                i = self._tensors * (context.replica_id_in_sync_group % self._local)
                return tf.nest.pack_sequence_as(self._batch_spec, parts[i:i + self._tensors])
            batches.append(self.strategy.experimental_distribute_values_from_function(
                value_fn))
        return self._step(batches)

    def _step(self, batches):
        """Computes the update and applies it only when loss and gradients are finite."""
        update = tf.cast(self.optimizer.iterations, tf.int64) + 1
        loss, tokens, square_norm, grads = self._compute(batches, self._fault(update))
        finite = tf.math.is_finite(loss)
        if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
            finite = tf.logical_and(finite, tf.math.is_finite(square_norm))
        finite = tf.logical_and(finite, self._in_a_row < self._halt_after)

        def apply():
            self.strategy.run(self._replica_apply, args=(grads,))
            return tf.constant(True)
        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        self._in_a_row.assign(tf.where(applied, tf.constant(0, tf.int64), self._in_a_row + 1))
        record = tf.stack([tf.cast(update, tf.float64), tf.cast(loss, tf.float64),
                           tf.cast(tokens, tf.float64), tf.cast(applied, tf.float64)])
        return {"loss": loss, "tokens": tokens, "applied": applied, "update": update,
                "record": record}

    def _updates(self, iterator, attempts):
        """`attempts` updates (each `_step`) on global batches read from `iterator` inside
        the graph; their records stacked, (attempts, 4), on the host device."""
        self.traces += 1

        def update(i, records):
            batches = [self.strategy.run(replica_slice, args=(next(iterator),))
                       for _ in range(self.accumulation_steps)]
            return i + 1, records.write(i, self._step(batches)["record"])

        records = tf.TensorArray(tf.float64, size=attempts, element_shape=[4])
        _, records = tf.while_loop(lambda i, _: i < attempts, update,
                                   (tf.constant(0), records))
        return records.stack()

    def loop(self, iterator) -> UpdateLoop:
        """An :class:`UpdateLoop`: several updates per call on global batches of `iterator`
        (the same one for the same iterator, so a second training loop does not retrace)."""
        if self._update_loop is None or self._update_loop.iterator is not iterator:
            self._update_loop = UpdateLoop(self, iterator)
        return self._update_loop

    def feed(self, iterator, depth: int = 2) -> DeviceFeed:
        """A :class:`DeviceFeed` of this trainer's updates from global batches of `iterator`."""
        return DeviceFeed(self.strategy, iterator, self.accumulation_steps, depth)

    def step(self, batches) -> dict:
        """One update from `batches` (a :meth:`DeviceFeed.pop` item); device tensors only.

        Returns {"loss": mean loss per real target token, "tokens": real target tokens,
        "applied": whether the update was applied, "update": its update number, "record":
        the four as one float64 vector} as tensors: reading them is the caller's choice
        (a sync). A non-finite step applies
        nothing: weights, optimizer state and step counter stay as they were. (Under
        mixed_float16 the loss-scale optimizer handles overflowing gradients itself.)
        """
        if self._concrete is None:  # calling the concrete function skips argument binding
            self._concrete = self._step_fn.get_concrete_function()
        return self._concrete(batches)

    def train_step(self, iterator):
        """One update from `accumulation_steps` global batches of `iterator`, read at once.

        Returns {"loss": float, "tokens": float, "finite": bool} (a convenience for tests
        and benchmarks: it waits for the step; the training loop uses :meth:`step`).
        """
        feed = DeviceFeed(self.strategy, iterator, self.accumulation_steps, depth=1)
        feed.fill(1)
        result = self.step(feed.pop())
        return {"loss": float(result["loss"]), "tokens": float(result["tokens"]),
                "finite": bool(result["applied"])}

    def gradients(self, batch):
        """(loss, gradients summed over replicas) of one global batch, without updating.

        The reference the replica-count tests compare; the same math as `train_step`.
        """
        @tf.function(input_signature=[self._batch_spec], autograph=False)
        def run(batch):
            batch = self.strategy.run(replica_slice, args=(batch,))
            tokens = self.strategy.reduce(
                SUM, self.strategy.run(self._replica_token_count, args=(batch,)), axis=None)
            loss, grads = self.strategy.run(self._grad_fn, args=(batch, tokens, 1.0))
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


class UpdateLoop:
    """Runs several updates in one `tf.function` call, reading their batches in the graph.

    `loop(n)` makes `n` update attempts (each :meth:`Trainer._step`, the same function the
    one-update path calls) on the next global batches of `iterator`, a plain tf.data
    iterator read with `next()` inside the graph, so its position (saved by a
    `tf.train.Checkpoint`) is exactly after the last batch an attempt used. Each replica
    takes its contiguous slice of every global batch (:func:`replica_slice`). Returns the
    attempts' records, a (n, 4) float64 tensor of (update number, loss, tokens, applied),
    unread: the metrics stay on the device until the caller reads them. `n` is a tensor,
    so any `n` (a call shortened to end at a sync point) reuses the one trace.
    """

    def __init__(self, trainer: Trainer, iterator):
        self.trainer, self.iterator = trainer, iterator
        function = tf.function(lambda attempts: trainer._updates(iterator, attempts),
                               autograph=False)
        self._concrete = function.get_concrete_function(tf.TensorSpec([], tf.int32))

    def __call__(self, attempts: int) -> tf.Tensor:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}.")
        return self._concrete(tf.constant(attempts, tf.int32))


class DeviceFeed:
    """Prefetches global batches of a plain tf.data iterator onto the replicas' devices.

    `fill(limit)` takes up to `depth` updates' worth of global batches (each update is
    `accumulation_steps` of them) from `iterator`, never more than `limit` updates, and
    places each replica's contiguous slice on its device (an asynchronous copy on GPU);
    `pop()` returns the oldest: the flat list of per-replica tensors `Trainer.step` takes.

    The position of the input lives in `iterator`, a plain tf.data iterator, which a
    `tf.train.Checkpoint` saves (a tf.distribute iterator cannot be checkpointed in TF
    2.21: it is not `Trackable`). Fill only up to the next checkpoint, so that at a
    checkpoint nothing is prefetched and the saved position is exact.
    """

    def __init__(self, strategy, iterator, accumulation_steps: int = 1, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}.")
        self.strategy, self.iterator = strategy, iterator
        self.accumulation_steps, self.depth = accumulation_steps, depth
        self._devices = strategy.extended.worker_devices
        self._first = _first_local_replica(strategy, len(self._devices))
        self._queue = collections.deque()

    def __len__(self) -> int:
        return len(self._queue)

    def _distribute(self, batch) -> list:
        """[source, decoder input, labels (, links)] of each local replica, on its device."""
        replicas = self.strategy.num_replicas_in_sync
        out = []
        for i, device in enumerate(self._devices):
            for t in tf.nest.flatten(batch):
                t = _slice(t, self._first + i, replicas)
                if t.device != device:  # a copy onto the replica's device (async on GPU)
                    with tf.device(device):
                        t = tf.identity(t)
                out.append(t)
        return out

    def fill(self, limit: int) -> None:
        """Prefetches until `depth` updates are queued or `limit` updates are queued."""
        while len(self._queue) < min(self.depth, limit):
            self._queue.append([t for _ in range(self.accumulation_steps)
                                for t in self._distribute(next(self.iterator))])

    def pop(self):
        """The oldest prefetched update's batches (fill first)."""
        if not self._queue:
            raise RuntimeError("DeviceFeed.pop() on an empty feed: call fill() first.")
        return self._queue.popleft()


def decoder_output(model, source_ids, decoder_input_ids, training=True,
                   return_attention_scores=False):
    """(B, T, D) decoder output of a tfxformer Transformer: its logits before the tied
    projection, i.e. `model((source_ids, decoder_input_ids))` is
    `model.embedding.logits(decoder_output(...))` (the same layers, in the same order);
    with the decoder's per-layer attention weights if asked."""
    memory, source_mask = model.encode(source_ids, training=training)
    return model.decoder_output(decoder_input_ids, memory, source_mask, training=training,
                                return_attention_scores=return_attention_scores)


def _has_tied_projection(model) -> bool:
    parts = ("encode", "decoder_output", "embedding")
    return (all(hasattr(model, p) for p in parts)
            and hasattr(model.embedding, "embeddings"))


def _first_local_replica(strategy, local: int) -> int:
    """Replica id (in sync) of this worker's first device: worker index * local replicas."""
    ids = strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group)
    values = strategy.experimental_local_results(ids)
    assert len(values) == local, (values, local)
    return int(values[0])


def _slice(t, index, replicas):
    """Rows [index * n, (index + 1) * n) of `t`, n = ceil(B / replicas)."""
    if replicas == 1:
        return t
    rows = -(-tf.shape(t)[0] // replicas)
    return t[index * rows:(index + 1) * rows]


def replica_slice(batch):
    """This replica's contiguous share of a global batch (call in a replica context).

    Rows [i * n, (i + 1) * n) with n = ceil(B / R) for replica i of R; the last replicas'
    shares may be smaller (or empty) when B is not a multiple of R, which only happens for
    evaluation batches.
    """
    context = tf.distribute.get_replica_context()
    index = tf.cast(context.replica_id_in_sync_group, tf.int32)
    return tf.nest.map_structure(
        lambda t: _slice(t, index, context.num_replicas_in_sync), batch)


def learning_rate(optimizer) -> float:
    """The optimizer's current learning rate as a float (Keras evaluates the schedule)."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
