"""The paper's building blocks as Keras layers (§3)."""

from tfxformer.layers.attention import MultiHeadAttention
from tfxformer.layers.block import LayerStack, ResidualBlock, TransformerBlock
from tfxformer.layers.decoder import Decoder, DecoderLayer
from tfxformer.layers.embedding import SharedEmbedding
from tfxformer.layers.encoder import Encoder, EncoderLayer
from tfxformer.layers.feed_forward import PositionwiseFeedForward
from tfxformer.layers.masks import causal_mask, padding_mask
from tfxformer.layers.position import PositionalEncoding, sinusoidal_encoding

__all__ = [
    "Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "LayerStack", "MultiHeadAttention",
    "PositionalEncoding", "PositionwiseFeedForward", "ResidualBlock", "SharedEmbedding",
    "TransformerBlock",
    "causal_mask", "padding_mask", "sinusoidal_encoding",
]
