"""Keras 3 quantization (`model.quantize("int8")`) that survives `.keras` saving.

`keras.Model.quantize("int8")` replaces the kernels of the model's `keras.layers.Dense`
sublayers (the position-wise feed-forward networks, §3.3) by int8 kernels with per-channel
float scales and gives those layers an "int8_from_<policy>" dtype policy. A subclassed
model's sublayers are created by the model's own constructor, not from saved layer
configs, so on `keras.models.load_model` they come back as float `Dense` layers and the
int8 variables in the file do not fit ("Layer 'inner' expected 2 variables, but received
... variables during loading"). Keras' remedy for subclassed models (the
`keras.dtype_policies.DTypePolicyMap` docstring; keras-hub's `Backbone.get_config`) is to
save a policy map {layer path: quantized policy} as the model's `dtype`. tfxformer saves
that map, but does not hand it down to the sublayers: a `Dense` holding a map mis-saves in
Keras 3.15 (`Dense._get_kernel_with_merged_lora` reads `self.dtype_policy.quantization_mode`,
the map's unquantized default, so a re-save writes `kernel_scale=None`: "Invalid dtype:
object"). Instead the model is built with the map's default policy and, once its sublayers
are built, each listed layer gets its quantized policy through the public
`layer.dtype_policy = policy` setter, which quantizes it (Keras' "implicit quantization"),
so it has the int8 layout before the weights are loaded, exactly as after `model.quantize`.
"""

from __future__ import annotations

import keras

# Helpers of Transformer's get_config / from_config / build; nothing here is public API.
__all__: list[str] = []


def _resolved_policy(layer):
    policy = layer._dtype_policy  # a layer built under a map resolves its path in it
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def pop_quantized_dtype(kwargs: dict) -> dict:
    """Takes a saved DTypePolicyMap `dtype` out of a model's constructor kwargs.

    Returns {layer path: quantized DTypePolicy} ({} for a plain policy) and leaves the map's
    default policy in `kwargs["dtype"]`.
    """
    policy = kwargs.get("dtype")
    if isinstance(policy, dict):  # a serialized policy from a config
        policy = keras.dtype_policies.get(policy)
    if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return {}
    kwargs["dtype"] = policy.default_policy
    return {path: policy[path] for path in policy._policy_map}


def restore_quantization(model: keras.Model, policies: dict) -> None:
    """Quantizes the built sublayers named in `policies` (from :func:`pop_quantized_dtype`).

    Raises:
        ValueError: a listed layer path is not in the model (a config from another model).
    """
    if not policies:
        return
    layers = {layer.path: layer for layer in model._flatten_layers(include_self=False)}
    missing = sorted(set(policies) - set(layers))
    if missing:
        raise ValueError(f"The saved quantized layers {missing} are not in {model.name!r}; "
                         f"its layers are {sorted(p for p in layers if p)[:8]} ...")
    for path, policy in policies.items():
        if layers[path].quantization_mode is None:
            layers[path].dtype_policy = policy  # Keras quantizes a built layer on this


def quantized_dtype(model: keras.Model) -> dict:
    """{"dtype": DTypePolicyMap of the quantized sublayers} for `model.get_config()`, or
    {} when nothing is quantized (the config then stays exactly as before)."""
    policy = model._dtype_policy
    default = (policy.default_policy
               if isinstance(policy, keras.dtype_policies.DTypePolicyMap) else policy)
    quantized = {layer.path: _resolved_policy(layer)
                 for layer in model._flatten_layers(include_self=False)
                 if layer.path and layer.quantization_mode is not None}
    if not quantized:
        return {}
    return {"dtype": keras.dtype_policies.DTypePolicyMap(default_policy=default,
                                                        policy_map=quantized)}
