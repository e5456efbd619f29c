"""The distributed train step: one global batch, same loss and gradients on 1, 2, 4 replicas.

The models have one encoder and one decoder layer (the "tiny" preset otherwise): what is
checked is the Trainer's arithmetic, and tracing a step under MirroredStrategy costs time
per layer and per replica.
"""

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import strategy_over

from tfxformer import Transformer
from tfxformer.schedules import paper_adam
from tfxformer.trainer import Trainer

VOCAB = 40
RNG = np.random.default_rng(7)


def _global_batch(size=8, src_len=7, tgt_len=6):
    """8 pairs of different real lengths, so replicas hold different numbers of tokens."""
    source = np.zeros((size, src_len), "int32")
    decoder_in = np.zeros((size, tgt_len), "int32")
    labels = np.zeros((size, tgt_len), "int32")
    for i in range(size):
        n, m = 1 + i % src_len, 1 + (3 * i) % tgt_len
        source[i, :n] = RNG.integers(4, VOCAB, n)
        target = RNG.integers(4, VOCAB, m)
        decoder_in[i, :m] = np.concatenate([[2], target[:-1]])
        labels[i, :m] = np.concatenate([target[:-1], [3]])
    return (source, decoder_in), labels


BATCH = _global_batch()
_REFERENCE_WEIGHTS = []
ONE_LAYER = dict(num_layers=1)  # the tiny preset with one layer each side: faster traces


def _trainer(strategy, accumulation_steps=1, optimizer=None):
    with strategy.scope():
        model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, **ONE_LAYER)
        model.build()
        if not _REFERENCE_WEIGHTS:
            _REFERENCE_WEIGHTS.extend(model.get_weights())
        model.set_weights(_REFERENCE_WEIGHTS)
        # Plain SGD where weights are compared: Adam's first step is lr * sign(g), which
        # flips for gradients that are zero up to rounding.
        optimizer = paper_adam(1e-3) if optimizer is None else optimizer()
    return Trainer(model, optimizer, strategy, label_smoothing=0.1,
                   accumulation_steps=accumulation_steps)


@pytest.fixture(scope="module")
def one_replica():
    """(trainer, loss, gradients) of BATCH on one replica: the reference of the tests below."""
    trainer = _trainer(strategy_over(1))
    loss, grads = trainer.gradients(BATCH)
    return trainer, float(loss), [g.numpy() for g in grads]


@pytest.mark.slow
def test_one_global_batch_same_loss_and_gradients_on_1_2_4_replicas(one_replica):
    """With 4 replicas each holds 2 of the 8 pairs, with different numbers of tokens."""
    _, ref_loss, ref_grads = one_replica
    for replicas in (2, 4):
        loss, grads = _trainer(strategy_over(replicas)).gradients(BATCH)
        loss, grads = float(loss), [g.numpy() for g in grads]
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        for g, ref in zip(grads, ref_grads, strict=True):
            np.testing.assert_allclose(g, ref, rtol=2e-4, atol=1e-6)


def test_the_loss_is_the_mean_over_real_target_tokens(one_replica):
    trainer, loss, _ = one_replica
    (source, decoder_in), labels = BATCH
    logits = trainer.model((source, decoder_in)).numpy()
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    real = labels != 0
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = ((0.9 * nll - 0.1 * log_probs.mean(-1)) * real).sum() / real.sum()
    assert loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch():
    strategy = strategy_over(2)
    whole = _trainer(strategy, optimizer=lambda: keras.optimizers.SGD(1.0))
    whole_step = whole.train_step(iter(tf.data.Dataset.from_tensors(BATCH)))
    split = _trainer(strategy, accumulation_steps=2, optimizer=lambda: keras.optimizers.SGD(1.0))
    halves = tf.data.Dataset.from_tensor_slices(BATCH).batch(4)
    split_step = split.train_step(iter(halves))
    assert split_step["tokens"] == whole_step["tokens"] == float((BATCH[1] != 0).sum())
    assert split_step["loss"] == pytest.approx(whole_step["loss"], rel=1e-5)
    for a, b in zip(split.model.get_weights(), whole.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _records(trainer, batches, n):
    """n updates through a DeviceFeed; their (update, loss, tokens, applied) read once."""
    feed = trainer.feed(iter(batches))
    results = []
    for remaining in range(n, 0, -1):
        feed.fill(remaining)
        results.append(trainer.step(feed.pop())["record"])
    assert len(feed) == 0  # nothing prefetched past the last update asked for
    return tf.stack(results).numpy()


def _fed(trainer, data):
    feed = trainer.feed(iter(data), depth=1)
    feed.fill(1)
    return feed.pop()


@pytest.mark.slow
def test_fault_steps_and_halt_run_on_the_device():
    """Fault steps are skipped and retried one update per call; then steps made
    non-finite by NaN weights apply nothing either, and after two in a row (the halt) no
    finite step is applied."""
    strategy = strategy_over(2)
    with strategy.scope():
        model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, **ONE_LAYER)
        model.build()
        optimizer = paper_adam(1e-3)
    trainer = Trainer(model, optimizer, strategy, halt_after_nonfinite=2,
                      nonfinite_fault_steps=[2, 3])
    records = _records(trainer, tf.data.Dataset.from_tensors(BATCH).repeat(), 5)
    # update 1 applied; 2 poisoned (first attempt); its retry is 2 again, applied; then 3
    # poisoned, its retry applied: no two in a row, so no halt.
    assert records[:, 0].tolist() == [1, 2, 2, 3, 3]
    assert records[:, 3].tolist() == [1, 0, 1, 0, 1]
    assert np.isnan(records[1, 1]) and np.isfinite(records[2, 1])
    assert int(optimizer.iterations.numpy()) == 3

    # A step made non-finite by the weights themselves (not by the fault switch) changes
    # nothing: weights, optimizer state and step counter (the same traced step). The
    # second in a row halts: with the weights made finite again nothing more is applied.
    embedding = model.embedding.embeddings
    clean = embedding.numpy()
    poisoned = clean.copy()
    poisoned[5] = np.nan
    embedding.assign(poisoned)
    before = [w.copy() for w in model.get_weights()]
    optimizer_before = [v.numpy().copy() for v in optimizer.variables]
    for _ in range(2):
        result = trainer.train_step(iter(tf.data.Dataset.from_tensors(BATCH)))
        assert not result["finite"]
        assert int(optimizer.iterations.numpy()) == 3
        for a, b in zip(model.get_weights(), before, strict=True):
            np.testing.assert_array_equal(a, b)
        for v, b in zip(optimizer.variables, optimizer_before, strict=True):
            np.testing.assert_array_equal(v.numpy(), b)
    embedding.assign(clean)
    before = [w.copy() for w in model.get_weights()]
    records = _records(trainer, tf.data.Dataset.from_tensors(BATCH).repeat(), 2)
    assert np.isfinite(records[:, 1]).all() and records[:, 3].tolist() == [0, 0]  # halted
    assert int(optimizer.iterations.numpy()) == 3
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)


TWO_SHAPES = [_global_batch(size, src, tgt) for size, src, tgt in ((8, 7, 6), (4, 9, 3))]


def _two_shapes():
    """The global batches of TWO_SHAPES, alternating forever (like length buckets)."""
    return tf.data.Dataset.from_tensors(TWO_SHAPES[0]).concatenate(
        tf.data.Dataset.from_tensors(TWO_SHAPES[1])).repeat()


@pytest.mark.parametrize("replicas,accumulation_steps", [
    (1, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_several_updates_per_call_equal_one_update_per_call(replicas, accumulation_steps):
    """The same records (update, loss, tokens, applied) and weights, bit for bit, as
    one update per call on the same batches; calls of 2 and 3 share one trace. And one
    update per call: one trace for every batch shape, device tensors that nobody reads
    per step. One replica (the fast tier), and two replicas with accumulation: the most
    demanding case, which holds two replicas without accumulation as well (the replicas'
    batches and the micro-batches are read by the same per-replica code)."""
    strategy = strategy_over(replicas)
    sgd = lambda: keras.optimizers.SGD(0.5)  # noqa: E731
    one = _trainer(strategy, accumulation_steps, optimizer=sgd)
    batches = iter(_two_shapes())
    first = one.step(_fed(one, batches))
    assert all(isinstance(v, tf.Tensor) for v in first.values())  # device tensors, unread
    one_records = np.concatenate([first["record"].numpy()[None],
                                  _records(one, batches, 4)])
    assert one.traces == 1  # both batch shapes (and the accumulated micro-batches)
    assert one_records[:, 0].tolist() == [1, 2, 3, 4, 5] and one_records[:, 3].all()
    several = _trainer(strategy, accumulation_steps, optimizer=sgd)
    updates = several.loop(iter(_two_shapes()))
    records = tf.concat([updates(2), updates(3)], axis=0)
    assert isinstance(records, tf.Tensor)  # unread until the caller asks
    np.testing.assert_array_equal(records.numpy(), one_records)
    assert records.numpy()[:, 3].all() and several.traces == 1
    for a, b in zip(several.model.get_weights(), one.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="attempts must be >= 1, got 0"):
        updates(0)


@pytest.mark.slow
def test_fault_steps_and_halt_inside_one_call():
    """A poisoned update inside a call is skipped and retried at the right update number;
    after a halt nothing more is applied in the same call."""
    strategy = strategy_over(2)
    trainer = _trainer(strategy)
    skip = Trainer(trainer.model, trainer.optimizer, strategy, halt_after_nonfinite=2,
                   nonfinite_fault_steps=[2, 3])
    records = skip.loop(iter(tf.data.Dataset.from_tensors(BATCH).repeat()))(5).numpy()
    assert records[:, 0].tolist() == [1, 2, 2, 3, 3]
    assert records[:, 3].tolist() == [1, 0, 1, 0, 1]
    assert np.isnan(records[1, 1]) and np.isfinite(records[2, 1])
    stop = Trainer(trainer.model, trainer.optimizer, strategy, halt_after_nonfinite=1,
                   nonfinite_fault_steps=[5])
    records = stop.loop(iter(tf.data.Dataset.from_tensors(BATCH).repeat()))(4).numpy()
    assert records[:, 0].tolist() == [4, 5, 5, 5] and records[:, 3].tolist() == [1, 0, 0, 0]
    assert int(trainer.optimizer.iterations.numpy()) == 4


@pytest.mark.slow
def test_split_cpu_keeps_the_callers_larger_split():
    """A caller split the CPU into 4 before TensorFlow started: a run asking for 1 device
    keeps the 4, so a later run in the process asking for 2 still finds them (in a fresh
    process: in this one conftest's split may already be initialised)."""
    code = ("import tensorflow as tf\n"
            "from tfxformer.distribute import make_strategy, split_cpu\n"
            "cpu = tf.config.list_physical_devices('CPU')[0]\n"
            "tf.config.set_logical_device_configuration(\n"
            "    cpu, [tf.config.LogicalDeviceConfiguration()] * 4)\n"
            "split_cpu(1)\n"
            "print(len(tf.config.get_logical_device_configuration(cpu)),\n"
            "      make_strategy(2).num_replicas_in_sync)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["4", "2"]
