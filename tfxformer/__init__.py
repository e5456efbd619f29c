"""tfxformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras.

The names below are the public API; each subpackage lists its own in `__all__`. They are
imported on first use, so that `tfxformer.config` (plain settings) loads without
TensorFlow.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the module that defines it ("" for a subpackage or module of its own).
_PUBLIC = {
    "ModelConfig": "tfxformer.config", "DecodingOptions": "tfxformer.config",
    "PRESETS": "tfxformer.config", "get_preset": "tfxformer.config",
    "Transformer": "tfxformer.models.transformer",
    "LabelSmoothedCrossEntropy": "tfxformer.losses",
    "MaskedTokenAccuracy": "tfxformer.metrics",
    "TransformerSchedule": "tfxformer.schedules", "paper_adam": "tfxformer.schedules",
    "beam_search": "tfxformer.decoding", "greedy_decode": "tfxformer.decoding",
    "config": "", "decoding": "", "layers": "", "losses": "", "metrics": "",
    "schedules": "", "serving": "", "data": "",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfxformer' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name] or f"tfxformer.{name}")
    value = module if not _PUBLIC[name] else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
