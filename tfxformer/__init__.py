"""tfxformer: the Transformer of "Attention Is All You Need" for TensorFlow/Keras."""

from tfxformer import config, decoding, layers, losses, metrics, schedules
from tfxformer.config import PRESETS, get_preset
from tfxformer.decoding import beam_search, greedy_decode
from tfxformer.losses import LabelSmoothedCrossEntropy
from tfxformer.metrics import MaskedTokenAccuracy
from tfxformer.models.transformer import Transformer
from tfxformer.schedules import TransformerSchedule, paper_adam

__version__ = "0.1.0"
__all__ = [
    "PRESETS", "LabelSmoothedCrossEntropy", "MaskedTokenAccuracy", "Transformer",
    "TransformerSchedule", "beam_search", "config", "decoding", "get_preset", "greedy_decode",
    "layers", "losses", "metrics", "paper_adam", "schedules",
]
