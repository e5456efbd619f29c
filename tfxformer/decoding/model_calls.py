"""How decoding calls a model's encoder and teacher-forced decoder: its own methods, or,
while an export traces its graphs, one traced function per model that every graph calls.

This module holds state, where :mod:`tfxformer.decoding.common` holds none: a context
variable, set by :func:`traced_once`, that changes what :func:`encode` and :func:`decode`
trace. The searches, scorers and model adapter of :mod:`tfxformer.decoding` call a model
through these two functions; only the serving side (every signature of a
:class:`tfxformer.serving.Translator`) enters :func:`traced_once`.

Why: an export traces a graph per signature (translate, translate_with_options,
translate_nbest, score, ...) and each of them encodes its source: without sharing, the
encoder's ops are built, written and loaded once per place that calls it (six in an
export), and the teacher-forced decoder once for `score` and once for `translate_nbest`'s
alternatives. Inside :func:`traced_once`, :func:`encode` and :func:`decode` are one
`tf.function` each per model, traced once for any batch and length, that every graph
calls. Each is written once in the SavedModel: an export of a shipped model is a fifth
smaller and faster to make, and loads in less memory (bench/README.md, "Serving memory").
The calls run once per batch, outside the search's loop: they add nothing per step.
Other graphs that every signature builds are shared the same way through :func:`shared`
(a translator's reading of its texts and the writing of its translations: the shipped
EN->DE exports in two thirds of the CPU time and loads in less than half,
bench/README.md).

An export also keeps, per model, the weights its searches would otherwise derive from the
model's variables at every call (the shared embedding transposed for the output
projection, the self-attention projections joined): :func:`keep_derived_weights` puts them
in the same dict, :func:`derived_weights` hands them to the search.

Outside :func:`traced_once` (a search called on its own, eagerly or in a user's
`tf.function`), :func:`encode` is `model.encode` and :func:`decode` `model.decode`.
"""
from __future__ import annotations

import contextlib
import contextvars

import tensorflow as tf

__all__ = ["decode", "derived_weights", "encode", "keep_derived_weights", "shared",
           "traced_once"]

# {(id(model), method name): (model, its tf.function)} of the innermost traced_once, or None.
_FUNCTIONS = contextvars.ContextVar("tfxformer_shared_functions", default=None)
_IDS = tf.TensorSpec([None, None], tf.int32)


@contextlib.contextmanager
def traced_once(functions: dict):
    """Within: :func:`encode` and :func:`decode` keep each model's function in `functions`
    (a dict the caller keeps for as long as its graphs may be traced: one per export)."""
    token = _FUNCTIONS.set(functions)
    try:
        yield
    finally:
        _FUNCTIONS.reset(token)


def shared(owner, name, python_function, input_signature=None):
    """Inside :func:`traced_once`: `owner`'s one `tf.function` of `python_function` named
    `name`, made on the first call and kept in the innermost `functions`, so that every
    graph traced there calls it and an export holds its graph once; outside one, None.
    Without an `input_signature` it is traced once per structure of arguments (shapes
    relaxed)."""
    functions = _FUNCTIONS.get()
    if functions is None:
        return None
    entry = functions.get((id(owner), name))
    if entry is None:  # the owner is kept with it: its id is never another object's
        function = tf.function(python_function, input_signature=input_signature,
                               autograph=False, reduce_retracing=input_signature is None)
        entry = functions[id(owner), name] = (owner, function)
    return entry[1]


def _function(model, name, specs):
    """The model's shared function `name` of the innermost :func:`traced_once`, or None
    outside one."""
    method = getattr(model, name)
    return shared(model, name, lambda *args: method(*args), specs)


def encode(model, source_ids):
    """`model.encode(source_ids)` at inference: ((B, S, D) memory, (B, S) bool source
    mask); inside :func:`traced_once`, through the model's one encoder function."""
    function = _function(model, "encode", [_IDS])
    if function is None:
        return model.encode(source_ids)
    return function(tf.cast(source_ids, tf.int32))


def decode(model, target_ids, memory, source_mask):
    """`model.decode(target_ids, memory, source_mask)` at inference (teacher-forced:
    (B, T, V) float32 logits); inside :func:`traced_once`, through the model's one
    function."""
    memory = tf.convert_to_tensor(memory)
    function = _function(model, "decode", [
        _IDS, tf.TensorSpec([None, None, memory.shape[-1]], memory.dtype),
        tf.TensorSpec([None, None], tf.bool)])
    if function is None:
        return model.decode(target_ids, memory, source_mask)
    return function(tf.cast(target_ids, tf.int32), memory, source_mask)


def keep_derived_weights(functions: dict, model, derived):
    """Keeps `derived` (:func:`tfxformer.models.search_step.derived_weights` of `model`,
    as the export's variables) in `functions`, for :func:`derived_weights`."""
    functions[id(model), "derived_weights"] = (model, derived)


def derived_weights(model):
    """The weights :func:`keep_derived_weights` kept for `model` in the innermost
    :func:`traced_once`, or None (outside one, or none kept): the search derives them."""
    functions = _FUNCTIONS.get()
    entry = None if functions is None else functions.get((id(model), "derived_weights"))
    return None if entry is None else entry[1]
