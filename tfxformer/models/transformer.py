"""The Transformer encoder–decoder (§3, Figure 1) as a keras.Model."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer.config import get_preset
from tfxformer.layers.decoder import Decoder
from tfxformer.layers.embedding import SharedEmbedding
from tfxformer.layers.encoder import Encoder
from tfxformer.layers.masks import padding_mask
from tfxformer.layers.position import PositionalEncoding
from tfxformer.quantize import pop_quantized_dtype, quantized_dtype, restore_quantization


@keras.saving.register_keras_serializable(package="tfxformer")
class Transformer(keras.Model):
    """The Transformer of "Attention Is All You Need" (Figure 1), for translation.

    Source and target share one vocabulary and one embedding matrix, which is also the
    pre-softmax projection (§3.4). Embeddings are multiplied by sqrt(d_model), the
    positional encoding is added (§3.5) and dropout applied to the sum (§5.4). Token id 0
    is padding: padded source positions are masked in every attention over the source,
    and the decoder self-attention is causal.

    Args:
        vocab_size: size of the shared vocabulary.
        num_layers: N, layers in each of the encoder and decoder (6).
        d_model: model width (512). num_heads: h (8). d_ff: FFN inner width (2048).
        dropout: P_drop on sub-layer outputs and embedding sums (0.1).
        attention_dropout, activation_dropout: extra dropouts (departures; default 0).
        norm_first: pre-norm (departure) instead of the paper's post-norm.
        position_embedding: "sinusoidal" (paper) or "learned" (Table 3 row E).
        max_length: longest sequence of a learned position table (and the translator's cap).
        layer_norm_epsilon: LayerNorm epsilon (1e-6).

    Call arguments:
        inputs: a tuple `(source_ids, target_ids)`: (B, S) and (B, T) integer ids, pad 0.
            The target ids are the decoder inputs (the target shifted right, starting with
            the start id).
        training: whether dropout is active.

    Returns:
        (B, T, vocab_size) float32 logits, also under mixed precision.

    Example:
    >>> model = Transformer.from_preset("tiny", vocab_size=100)
    >>> model((tf.constant([[5, 6, 7, 0]]), tf.constant([[1, 8]]))).shape
    TensorShape([1, 2, 100])
    """

    def __init__(self, vocab_size, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
                 dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, norm_first=False,
                 position_embedding="sinusoidal", max_length=1024, layer_norm_epsilon=1e-6,
                 **kwargs):
        self._saved_quantization = pop_quantized_dtype(kwargs)  # a quantized model's config
        super().__init__(**kwargs)
        self.model_config = dict(
            vocab_size=int(vocab_size), num_layers=int(num_layers), d_model=int(d_model),
            num_heads=int(num_heads), d_ff=int(d_ff), dropout=float(dropout),
            attention_dropout=float(attention_dropout),
            activation_dropout=float(activation_dropout), norm_first=bool(norm_first),
            position_embedding=position_embedding, max_length=int(max_length),
            layer_norm_epsilon=float(layer_norm_epsilon))
        stack_kwargs = {k: v for k, v in self.model_config.items()
                        if k not in ("vocab_size", "position_embedding", "max_length")}
        policy = self.dtype_policy
        self.embedding = SharedEmbedding(vocab_size, d_model, name="shared_embedding",
                                         dtype=policy)
        self.position = PositionalEncoding(position_embedding, max_length,
                                           name="positional_encoding", dtype=policy)
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.encoder = Encoder(name="encoder", dtype=policy, **stack_kwargs)
        self.decoder = Decoder(name="decoder", dtype=policy, **stack_kwargs)

    @classmethod
    def from_preset(cls, name, vocab_size, **overrides):
        """A model of preset `name` ("base", "big", "tiny", "small"; see tfxformer.config)."""
        return cls(**get_preset(name, vocab_size=vocab_size, **overrides))

    def build(self, input_shape=None):
        vectors = (None, None, self.model_config["d_model"])
        self.embedding.build()
        self.position.build(vectors)
        self.encoder.build(vectors)
        self.decoder.build(vectors)
        restore_quantization(self, self._saved_quantization)
        self.built = True

    def embed(self, ids, start_index=0, training=False):
        """Token ids -> dropout(embedding * sqrt(D) + positional encoding), (B, L, D)."""
        if not self.built:  # encode()/decode_step() may come before any __call__
            self.build()
        vectors = self.position(self.embedding(ids), start_index=start_index)
        return self.embedding_dropout(vectors, training=training)

    def encode(self, source_ids, training=False, return_attention_scores=False):
        """(B, S) ids -> ((B, S, D) memory, (B, S) bool source mask[, per-layer weights])."""
        source_mask = padding_mask(source_ids)
        out = self.encoder(self.embed(source_ids, training=training), padding_mask=source_mask,
                           return_attention_scores=return_attention_scores, training=training)
        if return_attention_scores:
            return out[0], source_mask, out[1]
        return out, source_mask

    def decode(self, target_ids, memory, source_mask, training=False,
               return_attention_scores=False):
        """Teacher-forced decoding: (B, T) decoder inputs -> (B, T, V) float32 logits."""
        out = self.decoder(self.embed(target_ids, training=training), memory,
                           memory_padding_mask=source_mask,
                           return_attention_scores=return_attention_scores, training=training)
        if return_attention_scores:
            return self.embedding.logits(out[0]), out[1]
        return self.embedding.logits(out)

    def init_cache(self, memory, max_length=None, batch_size=None):
        """Decoder cache for up to `max_length` target positions, or a growing one with
        None; `batch_size` rows of self-attention slots (see Decoder.init_cache)."""
        if not self.built:
            self.build()
        return self.decoder.init_cache(memory, max_length, batch_size=batch_size)

    def decode_step(self, target_ids, source_mask, cache, cache_index, append_cache=False,
                    return_attention_scores=False):
        """Incremental decoding: ids (B, t) at positions [cache_index, cache_index + t).

        Returns ((B, t, V) float32 logits, updated cache), with the per-layer attention
        weights between them if asked. Equal to the matching rows of :meth:`decode`.
        `source_mask` has the memory's batch, which may divide B (beams share it);
        `append_cache=True` for a growing cache (``init_cache(memory, None)``).
        """
        x = self.embed(target_ids, start_index=cache_index)
        out = self.decoder(x, None, memory_padding_mask=source_mask, cache=cache,
                           cache_index=cache_index, append_cache=append_cache,
                           return_attention_scores=return_attention_scores)
        logits = self.embedding.logits(out[0])
        return (logits,) + tuple(out[1:])

    def call(self, inputs, training=None):
        source_ids, target_ids = _unpack_inputs(inputs)
        memory, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, memory, source_mask, training=training)

    def compute_output_shape(self, input_shape):
        _, target_shape = input_shape
        return tuple(target_shape) + (self.model_config["vocab_size"],)

    def get_config(self):
        config = super().get_config()
        config.update(self.model_config)
        config.update(quantized_dtype(self))  # after model.quantize(): see tfxformer.quantize
        return config

    def input_signature(self):
        """The inputs `model.export` serves: int32 (source_ids, target_ids), both [None, None]."""
        return [(tf.TensorSpec([None, None], tf.int32, name="source_ids"),
                 tf.TensorSpec([None, None], tf.int32, name="target_ids"))]

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`keras.Model.export` with :meth:`input_signature` as the default signature.

        The artifact's `serve((source_ids, target_ids))` takes int32 ids of any batch and
        lengths and returns the (B, T, V) float32 logits. For translation (strings in,
        strings out, beam search) export a translator instead (README "Serving").
        """
        if input_signature is None:
            input_signature = self.input_signature()
        return super().export(filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _unpack_inputs(inputs):
    if isinstance(inputs, dict):
        missing = {"source_ids", "target_ids"} - set(inputs)
        if missing:
            raise ValueError(f"Transformer inputs dict lacks {sorted(missing)}; "
                             "give {'source_ids': (B, S), 'target_ids': (B, T)}.")
        return inputs["source_ids"], inputs["target_ids"]
    if not isinstance(inputs, (tuple, list)) or len(inputs) != 2:
        raise ValueError("Transformer expects inputs (source_ids, target_ids) or a dict "
                         f"with those keys, got {type(inputs).__name__}: {inputs!r:.200}.")
    return inputs[0], inputs[1]
