"""The contract every public layer keeps, checked by one helper (keras-hub's
`run_layer_test` idea): build, symbolic and eager call, output shape and dtype, graph
(tf.function) call, one `fit` step, config and `.keras` round trip, MirroredStrategy; and
the Keras workflows: the symbolic (functional API) output has the eager
output's structure, shapes and dtypes, in float32 and under mixed_bfloat16, for every call
variant (e.g. `return_attention_scores=True`); and a Keras mask (keras.layers.Masking in
front) is honoured like the explicit mask argument, and passed on."""

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
                   expected_dtype="float32", has_weights=True, variants=(), keras_mask=None):
    """Runs the layer contract for `cls(**init_kwargs)` called on `inputs` (a tuple of arrays).

    `inputs[0]` and the output are compared in shape; `call_kwargs` (masks, ...) are fixed
    keyword arguments of every call. A layer without weights skips the `fit` step.
    `variants`: more call keyword arguments (added to `call_kwargs`) whose outputs may be
    structures, e.g. `{"return_attention_scores": True}`. `keras_mask=(i, name)`: a Keras
    mask on `inputs[i]` must act as the explicit mask argument `name` (None: the layer
    is position-wise and must only pass the mask of `inputs[0]` on).
    """
    call_kwargs = call_kwargs or {}
    inputs = tuple(tf.convert_to_tensor(x) for x in inputs)
    for variant in ({},) + tuple(variants):
        for policy in ("float32", "mixed_bfloat16"):
            check_symbolic_matches_eager(cls, init_kwargs, inputs, {**call_kwargs, **variant},
                                         policy)
    if inputs[0].dtype.is_floating:
        check_keras_mask(cls, init_kwargs, inputs, call_kwargs, keras_mask)
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


def _spec(out):
    """The structure of `out` with (shape without batch, dtype) at the leaves."""
    return keras.tree.map_structure(
        lambda t: (tuple(t.shape[1:]), keras.backend.standardize_dtype(t.dtype)), out)


def check_symbolic_matches_eager(cls, init_kwargs, inputs, call_kwargs, policy):
    """The functional API gets the eager call's structure, shapes and dtypes (the declared
    dtype is the real one under mixed precision), and a functional model computes it."""
    layer = cls(**init_kwargs, dtype=policy)
    eager = layer(*inputs, **call_kwargs)
    symbolic_inputs = [keras.Input(shape=x.shape[1:], dtype=x.dtype.name) for x in inputs]
    symbolic = layer(*symbolic_inputs, **call_kwargs)
    assert _spec(symbolic) == _spec(eager), (policy, _spec(symbolic), _spec(eager))
    model = keras.Model(symbolic_inputs, symbolic)
    functional = model(list(inputs))
    keras.tree.map_structure(
        lambda a, b: np.testing.assert_allclose(np.asarray(a, "float32"),
                                                np.asarray(b, "float32"), rtol=1e-5, atol=1e-5),
        keras.tree.map_structure(lambda t: t.numpy(), functional),
        keras.tree.map_structure(lambda t: t.numpy(), eager))


def check_keras_mask(cls, init_kwargs, inputs, call_kwargs, keras_mask):
    """keras.layers.Masking in front (eager and functional) acts as the explicit mask."""
    lengths = [x.shape[1] for x in inputs]
    index, name = keras_mask if keras_mask else (0, None)
    real = np.ones((inputs[index].shape[0], lengths[index]), bool)
    real[-1, lengths[index] // 2:] = False  # the last row is padded from half its length
    padded = list(inputs)
    padded[index] = inputs[index] * real[..., None].astype(inputs[index].dtype.name)
    layer = cls(**init_kwargs)
    explicit = dict(call_kwargs, **({name: tf.constant(real)} if name else {}))
    want = _first(layer(*padded, **explicit)).numpy()
    call_kwargs = {k: v for k, v in call_kwargs.items() if k != name}  # the Keras mask's job

    masking = keras.layers.Masking()
    eager = layer(*[masking(x) if i == index else x for i, x in enumerate(padded)],
                  **call_kwargs)
    np.testing.assert_allclose(_first(eager).numpy(), want, rtol=1e-5, atol=1e-5)
    if index == 0:  # the output carries the input's mask on
        np.testing.assert_array_equal(getattr(_first(eager), "_keras_mask", None), real)

    symbolic_inputs = [keras.Input(shape=x.shape[1:], dtype=x.dtype.name) for x in inputs]
    masked = [keras.layers.Masking()(x) if i == index else x
              for i, x in enumerate(symbolic_inputs)]
    model = keras.Model(symbolic_inputs, _first(layer(*masked, **call_kwargs)))
    np.testing.assert_allclose(model(padded).numpy(), want, rtol=1e-5, atol=1e-5)


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
