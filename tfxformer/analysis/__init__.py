"""Looking inside a trained model: attention weights per layer and head (§3.2, Figures 3-5)."""

from tfxformer.analysis.attention import (
    KINDS,
    SentenceAttention,
    plot_attention,
    sentence_attention,
)

__all__ = ["KINDS", "SentenceAttention", "plot_attention", "sentence_attention"]
