"""A model's weights on disk, read into a model built of a handed class.

What every form of trained model (:mod:`tfxformer.locate`) reads its weights with: a
run dir's checkpoint, a SavedModel's variables, a preset dir's weights file. The model's
class is handed in (keras-hub's `load_backbone(cls, ...)`): this module imports none.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

from tfxformer import rundir
from tfxformer.config import PRECISION_POLICIES, ModelConfig
from tfxformer.rundir import CONFIG_FILENAME

__all__ = ["assign_weights", "build", "load_weights_file", "restore_checkpoint",
           "saved_model_variables", "weight_key"]

log = logging.getLogger("tfxformer")


def weight_key(path: str) -> str:
    """A weight's path below the model's own (auto-numbered) name, without a ":0"."""
    return path.rsplit(":", 1)[0].split("/", 1)[-1]


def assign_weights(model, values: dict, source: str) -> None:
    """Assigns `values` ({:func:`weight_key`: array}) to the built `model`'s weights.

    Raises:
        ValueError: a weight is missing from `values`, left over, or of another shape; the
            message names the weights and both shapes.
    """
    weights = {weight_key(w.path): w for w in model.weights}
    missing = sorted(set(weights) - set(values))
    unused = sorted(set(values) - set(weights))
    if missing or unused:
        raise ValueError(f"The weights of {source} do not fit this model: {len(missing)} of "
                         f"its {len(weights)} weights are not there (e.g. {missing[:3]}), "
                         f"{len(unused)} there are not the model's (e.g. {unused[:3]}).")
    wrong = [f"{key}: {tuple(values[key].shape)} in {source}, {tuple(w.shape)} in the model"
             for key, w in weights.items() if tuple(values[key].shape) != tuple(w.shape)]
    if wrong:
        raise ValueError(f"{len(wrong)} weight(s) of {source} do not fit this model: "
                         + "; ".join(wrong[:4]) + (" ..." if len(wrong) > 4 else "") + ".")
    for key, weight in weights.items():
        weight.assign(tf.cast(values[key], weight.dtype))


def build(cls, model: dict | ModelConfig, precision: str | None = "fp32"):
    """A built `cls` (e.g. :class:`tfxformer.Transformer`) of a record's "model" (random
    weights), computing in `precision` ("fp32", "bf16", "fp16"; None: the Keras global
    policy), with every weight reachable by `tf.train.Checkpoint`.

    Raises:
        ValueError: a bad precision, or weights a checkpoint could not hold.
    """
    if precision is not None and precision not in PRECISION_POLICIES:
        raise ValueError(f"precision {precision!r} not in {sorted(PRECISION_POLICIES)}.")
    dtype = {} if precision is None else {"dtype": PRECISION_POLICIES[precision]}
    built = cls(ModelConfig.from_dict(model), **dtype)
    built.build()
    untracked = rundir.untracked_weights(built)
    if untracked:
        raise ValueError(
            f"{len(untracked)} of {len(built.weights)} model weights are not tracked by "
            f"tf.train.Checkpoint (e.g. {untracked[:3]}), so a checkpoint can neither hold "
            "nor restore them; the model's layer tracking must be fixed.")
    return built


def restore_checkpoint(model, checkpoint: str) -> None:
    """Restores the run dir checkpoint `checkpoint` (a prefix) into the built `model`,
    every model weight restored; optimizer and step entries are ignored."""
    rundir.restore(tf.train.Checkpoint(model=model), checkpoint,
                   f"the model of {CONFIG_FILENAME}")
    log.info("Loaded %s", checkpoint)


def load_weights_file(model, path: str) -> None:
    """Loads a Keras weights file (`model.weights.h5`) into the built `model`.

    Raises:
        ValueError: the file does not fit the model.
    """
    try:
        model.load_weights(path)
    except (ValueError, OSError) as error:
        raise ValueError(f"{path} does not fit the model of its {CONFIG_FILENAME}: "
                         f"{str(error)[:400]}") from None


def saved_model_variables(version_dir) -> dict:
    """{:func:`weight_key`: array} of the `model_variables` of a SavedModel exported by
    this package, read from its variables checkpoint by way of its object graph (the
    SavedModel's functions are not loaded: a tenth of a second, where
    `tf.saved_model.load` takes seconds).

    Raises:
        ValueError: the SavedModel has no `model_variables` (not a translator exported by
            this package) or its checkpoint lacks one of them.
    """
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(version_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    nodes = saved.meta_graphs[0].object_graph_def.nodes
    children = {child.local_name: child.node_id for child in nodes[0].children}
    if "model_variables" not in children:
        raise ValueError(f"SavedModel {version_dir!r} has no `model_variables`: not a "
                         "translator exported by this package.")
    reader = tf.train.load_checkpoint(os.path.join(version_dir, "variables", "variables"))
    # The checkpoint's object graph numbers its nodes as the SavedModel's does.
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    values = {}
    for child in nodes[children["model_variables"]].children:
        keys = [a.checkpoint_key for a in graph.nodes[child.node_id].attributes
                if a.name == "VARIABLE_VALUE"]
        if not keys or not reader.has_tensor(keys[0]):
            raise ValueError(f"SavedModel {version_dir!r}: the checkpoint lacks variable "
                             f"{nodes[child.node_id].variable.name!r}.")
        values[weight_key(nodes[child.node_id].variable.name)] = reader.get_tensor(keys[0])
    return values
