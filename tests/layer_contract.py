"""The contract every public layer keeps, checked by one helper (keras-hub's
`run_layer_test` idea): build, symbolic and eager call, output shape and dtype, graph
(tf.function) call, one `fit` step, config and `.keras` round trip, MirroredStrategy."""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf


class _Wrapper(keras.Model):
    """Calls `layer(*tensors, **call_kwargs)` and returns the first output."""

    def __init__(self, layer, call_kwargs=None, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer
        self.call_kwargs = call_kwargs or {}

    def call(self, inputs, training=None):
        out = self.layer(*inputs, training=training, **self.call_kwargs)
        return out[0] if isinstance(out, tuple) else out


def run_layer_test(cls, init_kwargs, inputs, expected_shape, call_kwargs=None,
                   expected_dtype="float32", has_weights=True):
    """Runs the layer contract for `cls(**init_kwargs)` called on `inputs` (a tuple of arrays).

    `inputs[0]` and the output are compared in shape; `call_kwargs` (masks, ...) are fixed
    keyword arguments of every call. A layer without weights skips the `fit` step.
    """
    call_kwargs = call_kwargs or {}
    inputs = tuple(tf.convert_to_tensor(x) for x in inputs)
    layer = cls(**init_kwargs)

    # Eager call builds the layer.
    out = _first(layer(*inputs, **call_kwargs))
    assert tuple(out.shape) == tuple(expected_shape), (out.shape, expected_shape)
    assert out.dtype == expected_dtype, out.dtype
    assert layer.built and bool(layer.weights) == has_weights, layer.weights

    # Explicit build gives the same weight shapes.
    fresh = cls(**init_kwargs)
    fresh.build(*[x.shape for x in inputs])
    assert sorted(tuple(w.shape) for w in fresh.weights) == \
        sorted(tuple(w.shape) for w in layer.weights)

    # Symbolic call (functional API) with the batch dimension unknown.
    symbolic = [keras.Input(shape=x.shape[1:], dtype=x.dtype.name) for x in inputs]
    sym_out = _first(cls(**init_kwargs)(*symbolic, **call_kwargs))
    assert tuple(sym_out.shape[1:]) == tuple(expected_shape[1:]), sym_out.shape

    # Graph mode gives the eager result.
    graph_out = tf.function(lambda *xs: _first(layer(*xs, **call_kwargs)))(*inputs)
    np.testing.assert_allclose(graph_out.numpy(), out.numpy(), rtol=1e-5, atol=1e-5)

    # Config round trip: same config, and with the same weights the same output.
    config = layer.get_config()
    clone = cls.from_config(config)
    assert clone.get_config() == config
    clone.build(*[x.shape for x in inputs])
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_first(clone(*inputs, **call_kwargs)).numpy(), out.numpy(),
                               rtol=1e-5, atol=1e-5)
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["registered_name"].startswith("tfxformer>"), serialized["registered_name"]
    assert type(keras.saving.deserialize_keras_object(serialized)) is cls

    # .keras round trip of a model holding the layer.
    model = keras.Model(symbolic, cls(**init_kwargs)(*symbolic, **call_kwargs))
    model.set_weights([w.numpy() for w in _weights_like(model, layer)])
    path = os.path.join(tempfile.mkdtemp(), "layer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(_first(loaded(list(inputs))).numpy(), out.numpy(),
                               rtol=1e-5, atol=1e-5)

    if has_weights:
        _fit_one_step(cls(**init_kwargs), inputs, call_kwargs)
    return layer, out


def _fit_one_step(layer, inputs, call_kwargs):
    """One `model.fit` step changes the weights and gives a finite loss."""
    model = _Wrapper(layer, call_kwargs, name="wrapper")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    out = model(inputs)
    target = tf.ones_like(out)
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(tf.data.Dataset.from_tensors((inputs, target)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [w.numpy() for w in model.trainable_weights]
    changed = [not np.array_equal(a, b) for a, b in zip(before, after, strict=True)]
    assert any(changed), "fit changed nothing"


def _weights_like(model, layer):
    """The weights of `layer`, in the order of `model`'s weights (same architecture)."""
    assert len(model.weights) == len(layer.weights)
    return layer.weights


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def build_under_strategy(factory, inputs, strategy, call_kwargs=None):
    """Builds `factory()` inside `strategy.scope()` and checks its variables are mirrored."""
    with strategy.scope():
        layer = factory()
        out = _first(layer(*inputs, **(call_kwargs or {})))
    assert all(isinstance(w.value, tf.distribute.DistributedValues) or
               "Mirrored" in type(w.value).__name__ or "Mirrored" in type(w).__name__
               for w in layer.weights) or strategy.num_replicas_in_sync == 1
    return out
