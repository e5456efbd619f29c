"""tfxformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras.

The names below are the public API; each subpackage lists its own in `__all__`.
`import tfxformer` registers every Keras class the package defines (layers, the model,
losses, metrics, schedules), so that a saved `.keras` file using them loads after it, as
after `import keras_hub`. The decoding, serving and data subpackages load on first use.
"""

from __future__ import annotations

import importlib

from tfxformer import config, layers, losses, metrics, schedules
from tfxformer.config import PRESETS, DecodingOptions, ModelConfig, get_preset
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.metrics import MaskedTokenAccuracy
from tfxformer.models.transformer import Transformer
from tfxformer.schedules import TransformerSchedule, paper_adam

__version__ = "0.1.0"

# Loaded on first use: public name -> the module that defines it ("" for a subpackage).
_LAZY = {
    "beam_search": "tfxformer.decoding", "greedy_decode": "tfxformer.decoding",
    "decoding": "", "serving": "", "data": "",
}
__all__ = [
    "PRESETS", "DecodingOptions", "LabelSmoothedCrossEntropy", "MaskedTokenAccuracy",
    "ModelConfig", "Transformer", "TransformerSchedule", "beam_search", "config", "data",
    "decoding", "get_preset", "greedy_decode", "layers", "losses", "metrics", "paper_adam",
    "schedules", "serving",
]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tfxformer' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name] or f"tfxformer.{name}")
    value = module if not _LAZY[name] else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
