from tfxformer.models.transformer import Transformer

__all__ = ["Transformer"]
