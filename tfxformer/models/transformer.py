"""The Transformer encoder–decoder (§3, Figure 1) as a keras.Model."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfxformer import checks, pretrained
from tfxformer.config import PRESETS, ModelConfig, get_preset
from tfxformer.layers.attention import head_average
from tfxformer.layers.decoder import Decoder
from tfxformer.layers.embedding import SharedEmbedding
from tfxformer.layers.encoder import Encoder
from tfxformer.layers.masks import padding_mask
from tfxformer.layers.ops import matmul_last
from tfxformer.layers.position import PositionalEncoding
from tfxformer.locate import is_model_path
from tfxformer.models import search_step
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
        config: a :class:`tfxformer.config.ModelConfig` (vocabulary size, N, d_model, h,
            d_ff, dropouts, norm placement, position table; its defaults are the paper's
            base model), or None to build one from the keyword arguments.
        **kwargs: `ModelConfig` fields (`Transformer(vocab_size=100, num_layers=2)`, or
            overrides of `config`), then the arguments of keras.Model (name, dtype, ...).

    Call arguments:
        inputs: a tuple `(source_ids, target_ids)`: (B, S) and (B, T) integer ids, pad 0.
            The target ids are the decoder inputs (the target shifted right, starting with
            the start id).
        training: whether dropout is active.

    Returns:
        (B, T, vocab_size) float32 logits, also under mixed precision (and so declared to
        the functional API).

    Example:
    >>> import tensorflow as tf
    >>> model = Transformer.from_preset("tiny", vocab_size=100)
    >>> model((tf.constant([[5, 6, 7, 0]]), tf.constant([[1, 8]]))).shape
    TensorShape([1, 2, 100])
    """

    def __init__(self, config: ModelConfig | None = None, **kwargs):
        fields = {k: kwargs.pop(k) for k in ModelConfig.field_names() if k in kwargs}
        config = ModelConfig(**fields) if config is None else \
            ModelConfig.from_dict(config).replace(**fields)
        self._saved_quantization = pop_quantized_dtype(kwargs)  # a quantized model's config
        super().__init__(**kwargs)
        policy = self.dtype_policy
        self.model_config = config
        self.embedding = SharedEmbedding(config.vocab_size, config.d_model,
                                         name="shared_embedding", dtype=policy)
        self.position = PositionalEncoding(config.position_embedding, config.max_positions,
                                           name="positional_encoding", dtype=policy)
        self.embedding_dropout = keras.layers.Dropout(config.dropout, dtype=policy)
        stack = dict(num_layers=config.num_layers, **config.layer_settings())
        self.encoder = Encoder(name="encoder", dtype=policy, **stack)
        self.decoder = Decoder(name="decoder", dtype=policy, **stack)

    @classmethod
    def from_preset(cls, name, vocab_size=None, **overrides):
        """A new model of preset `name` ("base", "big", "tiny", "small"; see
        tfxformer.config), or the trained model at path `name` with its weights: a
        SavedModel export or version dir, a run dir, or a :meth:`save_to_preset` dir
        (:mod:`tfxformer.pretrained`; `overrides` such as dropout, no other vocab_size)."""
        if is_model_path(name):
            return pretrained.load_model(cls, name, vocab_size, **overrides)
        if vocab_size is None and name in PRESETS:
            raise ValueError(f"Preset {name!r} needs a `vocab_size`.")
        return cls(get_preset(name, vocab_size=vocab_size, **overrides))

    def save_to_preset(self, preset_dir, tokenizer=None, src=None, tgt=None):
        """Writes config.json, model.weights.h5, metadata.json and (with the vocabulary
        the model was loaded with, or `tokenizer`) spm.model into `preset_dir`, which
        :meth:`from_preset`, ``Tokenizer.from_preset`` and every script's ``--model``
        read back; returns `preset_dir`. `src`, `tgt`: the languages it translates
        between (default: those of the model it was loaded from), recorded for
        ``--init-from`` and exports."""
        return pretrained.save_preset(self, preset_dir, tokenizer, src, tgt)

    def build(self, input_shape=None):
        vectors = (None, None, self.model_config.d_model)
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
        """(B, S) ids -> ((B, S, D) memory, (B, S) bool source mask), with the per-layer
        (B, H, S, S) self-attention weights as a third element if asked."""
        source_mask = padding_mask(source_ids)
        out = self.encoder(self.embed(source_ids, training=training), padding_mask=source_mask,
                           return_attention_scores=return_attention_scores, training=training)
        if return_attention_scores:
            return out[0], source_mask, out[1]
        return out, source_mask

    def decode(self, target_ids, memory, source_mask, training=False,
               return_attention_scores=False):
        """Teacher-forced decoding: (B, T) decoder inputs -> (B, T, V) float32 logits, or
        (logits, per-layer {"self", "cross"} weights) if asked."""
        out = self.decoder_output(target_ids, memory, source_mask, training=training,
                                  return_attention_scores=return_attention_scores)
        if return_attention_scores:
            return self.embedding.logits(out[0]), out[1]
        return self.embedding.logits(out)

    def decoder_output(self, target_ids, memory, source_mask, training=False,
                       return_attention_scores=False):
        """:meth:`decode` before the tied output projection: (B, T, D) decoder states (the
        training step's fused loss projects them itself, see tfxformer.losses)."""
        return self.decoder(self.embed(target_ids, training=training), memory,
                            memory_padding_mask=source_mask,
                            return_attention_scores=return_attention_scores, training=training)

    def cross_attention(self, target_ids, memory, source_mask, layer=None, heads=None):
        """Teacher-forced: (B, T) decoder inputs -> the (B, T, S) float32 encoder–decoder
        attention (§3.2.3) of decoder layer `layer` (0 the bottom; negative counts from
        the top, -2 the penultimate), averaged over its first `heads` heads (0: all).
        None takes the model's `alignment_layer` / `alignment_heads` (:class:`ModelConfig`:
        a model trained with guided alignment reads its supervised head). Only the layers
        up to `layer` run. What word alignments read (:mod:`tfxformer.serving.alignment`)."""
        config = self.model_config
        layer = config.alignment_layer if layer is None else layer
        heads = config.alignment_heads if heads is None else heads
        stack = self.decoder.stack
        index = checks.integer(layer, "layer", -len(stack), len(stack) - 1) % len(stack)
        heads = checks.integer(heads, "heads", 0, config.num_heads)
        x = self.embed(target_ids)
        for block in stack[:index]:
            x = block(x, memory, memory_padding_mask=source_mask)
        _, weights = stack[index](x, memory, memory_padding_mask=source_mask,
                                  return_attention_scores=True)
        return head_average(weights["cross"], heads)

    def init_cache(self, memory, cache_length=None, batch_size=None):
        """Decoder cache of `cache_length` target positions (for `static_cache=True`
        steps), or a growing one with None (for `static_cache=False`); `batch_size` N rows
        of self-attention slots (default B; B * beams for beam search), see
        Decoder.init_cache."""
        if not self.built:
            self.build()
        return self.decoder.init_cache(memory, cache_length, batch_size=batch_size)

    def decode_step(self, target_ids, source_mask, cache, cache_index, static_cache=True,
                    beams=1, logit_rows=None):
        """Incremental decoding: ids (N, t) at positions [cache_index, cache_index + t).

        Always returns ((N, t, V) float32 logits, updated cache), equal to the matching
        rows of :meth:`decode`. `source_mask` (B, S) has the memory's batch; `beams` is the
        number of rows of `target_ids` per memory row, N = B * beams (row b * beams + k is
        hypothesis k of sentence b), so the beams of a sentence read its memory once.
        `static_cache=True` writes into the slots of ``init_cache(memory, L)``;
        `static_cache=False` appends to a growing cache (``init_cache(memory, None)``).
        `logit_rows` (V', D): rows of the shared embedding (a vocabulary shortlist,
        gathered once per batch, :mod:`tfxformer.decoding.shortlist`); the logits are then
        (N, t, V') over those tokens only, the same values as the full logits' columns.
        """
        x = self.embed(target_ids, start_index=cache_index)
        out, cache = self.decoder.call_cached(x, cache, cache_index,
                                              memory_padding_mask=source_mask,
                                              static_cache=static_cache, beams=beams)
        if logit_rows is None:
            return self.embedding.logits(out), cache
        kernel = tf.cast(logit_rows, out.dtype)  # as SharedEmbedding.logits, on V' rows
        return tf.cast(matmul_last(out, kernel, transpose_b=True), tf.float32), cache

    def search_step(self, columns, logit_rows=None, static_cache=False, derived=None):
        """The step function every search runs on this model, its weights read now
        (:class:`tfxformer.models.search_step.SearchStep`: `decode_step`'s logits for one
        token per row, in fewer ops), or None for a subclass with its own `decode_step`
        (then the search takes that). `columns`: the output positions the search may
        reach (L); `logit_rows` (V', D): the embedding rows the logits are over (a
        vocabulary shortlist), or None; `static_cache`: a cache of L positions written in
        place (XLA), else one that grows a position a step; `derived`: the step's
        :func:`~tfxformer.models.search_step.derived_weights`, computed beforehand (an
        export keeps them as variables), or None."""
        if type(self).decode_step is not Transformer.decode_step:
            return None
        if not self.built:
            self.build()
        return search_step.SearchStep(self, columns, logit_rows, static_cache, derived)

    def search_step_weights(self):
        """What :meth:`search_step` derives from the variables at every call unless given
        it (:func:`~tfxformer.models.search_step.derived_weights`), computed now; None
        where there is no search step."""
        if type(self).decode_step is not Transformer.decode_step:
            return None
        if not self.built:
            self.build()
        return search_step.derived_weights(self)

    def call(self, inputs, training=None):
        source_ids, target_ids = _unpack_inputs(inputs)
        memory, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, memory, source_mask, training=training)

    def compute_output_spec(self, inputs, training=None):
        """(B, T, vocab_size) float32: the logits stay float32 under mixed precision."""
        _, target = _unpack_inputs(inputs)
        shape = tuple(target.shape) + (self.model_config.vocab_size,)
        return keras.KerasTensor(shape, "float32")

    def compute_output_shape(self, input_shape):
        _, target_shape = input_shape
        return tuple(target_shape) + (self.model_config.vocab_size,)

    def get_config(self):
        config = super().get_config()
        config.update(self.model_config.to_dict())
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
        """The model of `get_config()`'s dict; one written by an earlier version (old
        setting names) is upgraded (:meth:`ModelConfig.from_dict`)."""
        config = dict(config)
        names = ModelConfig.stored_names()
        model = {k: config.pop(k) for k in list(config) if k in names}
        return cls(ModelConfig.from_dict(model), **config)


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
