"""tfxformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras."""

from tfxformer import config, layers
from tfxformer.config import PRESETS, get_preset
from tfxformer.models.transformer import Transformer

__version__ = "0.1.0"
__all__ = ["PRESETS", "Transformer", "config", "get_preset", "layers"]
