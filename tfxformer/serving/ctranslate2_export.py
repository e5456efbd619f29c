"""Export to CTranslate2: a trained model of this package as a CTranslate2 model directory.

:func:`export_ctranslate2` (`scripts/export.py --format ctranslate2`) loads a SavedModel,
run dir or preset dir, builds a `ctranslate2.specs.TransformerSpec` from its weights
(:func:`build_spec`) and writes, atomically, a directory that
:mod:`tfxformer.serving.ctranslate2` translates with:

    model.bin, config.json, shared_vocabulary.json   CTranslate2's own files
    spm.model                                         the SentencePiece vocabulary (§5.1)
    tfxformer.json                                    the record: languages, model
                                                      settings, decoding options, weights type

The mapping (log-probabilities checked against the Keras model in
tests/test_ctranslate2.py): post-norm (the paper's) or pre-norm with a final LayerNorm on
each stack (`norm_first`); ReLU; embeddings × sqrt(d_model) (§3.4), one matrix for the
source and target embeddings and the pre-softmax projection (bias 0); the LayerNorm
epsilon; the query, key and value kernels fused into CTranslate2's (out, in) matrices
(ours are (in, out)); the position table stored with the model: ours interleaves sine and
cosine from position 0 (§3.5, :func:`tfxformer.layers.position.sinusoidal_encoding`) where
CTranslate2's built-in one is [sin | cos] halves from position 1; a learned table is
stored as it is. Not converted: multilingual models (their target tags) and ensembles,
each a clear error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import sentencepiece

from tfxformer import locate
from tfxformer.config import POSITION_EMBEDDINGS, DecodingOptions, ModelConfig
from tfxformer.ids import SPM_FILENAME
from tfxformer.layers.position import sinusoidal_encoding
from tfxformer.models.transformer import Transformer
from tfxformer.serving.ctranslate2 import (
    FORMAT,
    FORMAT_VERSION,
    MARKER_FILENAME,
    QUANTIZATIONS,
    SPECIAL_PIECES,
    import_ctranslate2,
)
from tfxformer.weights import weight_key

__all__ = ["build_spec", "export_ctranslate2", "save_spec"]


def check_convertible(model: ModelConfig, target_languages=(), ensemble=False) -> None:
    """Raises ValueError for a model the converter does not handle, naming what is not."""
    if ensemble:
        raise ValueError("An ensemble does not convert to CTranslate2 (one model per "
                         "directory); export a member's run dir or SavedModel.")
    if target_languages:
        raise ValueError(f"A multilingual model (target languages "
                         f"{', '.join(target_languages)}: a target tag leads each source) "
                         "does not convert to CTranslate2 yet; export it as a SavedModel.")
    if model.position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(f"position_embedding {model.position_embedding!r} does not convert; "
                         f"accepted: {list(POSITION_EMBEDDINGS)}.")


def _position_table(model: ModelConfig, weights: dict) -> np.ndarray:
    if model.position_embedding == "learned":
        return _weight(weights, "positional_encoding/position_embeddings")
    return sinusoidal_encoding(np.arange(model.max_positions), model.d_model).numpy()


def _weight(weights: dict, key: str) -> np.ndarray:
    if key not in weights:
        raise ValueError(f"Weight {key!r} is missing: the converter maps a float32 "
                         "Transformer of this package (not a Keras-quantized one); weights "
                         f"given: {sorted(weights)[:4]} ... ({len(weights)} in all).")
    return np.asarray(weights[key], np.float32)


def set_layer(spec_layer, weights: dict, prefix: str, decoder: bool) -> None:
    """One encoder (`decoder` False) or decoder layer of the spec from `weights` under
    `prefix` (e.g. "encoder/layer_0"): Dense kernels are (in, out), CTranslate2's (out, in)."""
    def dense(linear, *names):
        linear.weight = np.concatenate(
            [_weight(weights, f"{prefix}/{n}_kernel").T for n in names], 0)
        linear.bias = np.concatenate([_weight(weights, f"{prefix}/{n}_bias") for n in names])

    def norm(layer_norm, block):
        layer_norm.gamma = _weight(weights, f"{prefix}/{block}/norm/gamma")
        layer_norm.beta = _weight(weights, f"{prefix}/{block}/norm/beta")

    attention = spec_layer.self_attention
    dense(attention.linear[0], "self_attention/query", "self_attention/key",
          "self_attention/value")
    dense(attention.linear[1], "self_attention/output")
    norm(attention.layer_norm, "self_attention_block" if decoder else "attention_block")
    if decoder:
        cross = spec_layer.attention
        dense(cross.linear[0], "cross_attention/query")
        dense(cross.linear[1], "cross_attention/key", "cross_attention/value")
        dense(cross.linear[2], "cross_attention/output")
        norm(cross.layer_norm, "cross_attention_block")
    ffn = spec_layer.ffn
    for linear, name in ((ffn.linear_0, "inner"), (ffn.linear_1, "outer")):
        linear.weight = _weight(weights, f"{prefix}/feed_forward/{name}/kernel").T
        linear.bias = _weight(weights, f"{prefix}/feed_forward/{name}/bias")
    norm(ffn.layer_norm, "feed_forward_block")


def build_spec(model: ModelConfig, weights: dict, pieces):
    """The `ctranslate2.specs.TransformerSpec` of a Transformer of this package.

    Args:
        model: its :class:`tfxformer.config.ModelConfig`.
        weights: {weight path below the model's name (e.g. "encoder/layer_0/
            self_attention/query_kernel"): array}, as :func:`tfxformer.pretrained.weight_key`.
        pieces: the vocabulary in id order, starting "<pad>", "<unk>", "<s>", "</s>".

    Raises:
        ValueError: a weight is missing, or the vocabulary does not fit.
    """
    ctranslate2 = import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    check_convertible(model)
    pieces = list(pieces)
    if tuple(pieces[:4]) != SPECIAL_PIECES or len(pieces) != model.vocab_size:
        raise ValueError(f"The vocabulary must hold {model.vocab_size} pieces starting "
                         f"{list(SPECIAL_PIECES)} (ids 0-3), got {len(pieces)} starting "
                         f"{pieces[:4]}.")
    spec = transformer_spec.TransformerSpec.from_config(
        model.num_layers, model.num_heads, pre_norm=model.norm_first,
        no_final_norm=not model.norm_first, activation=ctranslate2.specs.Activation.RELU,
        alignment_layer=model.alignment_layer,  # what its return_attention reads, as ours
        alignment_heads=model.alignment_heads or model.num_heads)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    embeddings = _weight(weights, "shared_embedding/embeddings")
    table = _position_table(model, weights)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings
    spec.decoder.projection.bias = np.zeros(embeddings.shape[0], np.float32)
    for stack in (spec.encoder, spec.decoder):
        stack.position_encodings.encodings = table
    for i in range(model.num_layers):
        set_layer(spec.encoder.layer[i], weights, f"encoder/layer_{i}", decoder=False)
        set_layer(spec.decoder.layer[i], weights, f"decoder/layer_{i}", decoder=True)
    if model.norm_first:
        for name, stack in (("encoder", spec.encoder), ("decoder", spec.decoder)):
            stack.layer_norm.gamma = _weight(weights, f"{name}/final_norm/gamma")
            stack.layer_norm.beta = _weight(weights, f"{name}/final_norm/beta")
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def save_spec(spec, directory: str, quantization: str | None = None) -> str:
    """Writes `spec` as CTranslate2's model.bin, config.json and vocabulary into
    `directory` (replaced if it exists), weights stored as `quantization`."""
    ctranslate2 = import_ctranslate2()

    class _SpecConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    return _SpecConverter().convert(directory, quantization=quantization, force=True)


def _loaded(path, checkpoint=None):
    """(model config, {weight key: array}, RunRecord, spm bytes, source) of the trained
    model at `path` (SavedModel, run dir or preset dir; :func:`tfxformer.locate.resolve`)."""
    source = locate.resolve(path, locate.ONE_MODEL, "export_ctranslate2")
    record = source.record()
    check_convertible(record.model, record.target_languages, bool(record.export.get(
        "ensemble")))
    if record.reverse_target:
        raise ValueError(f"{path!r} is a right-to-left model (`reverse_target`): CTranslate2 "
                         "would return its translations with the pieces reversed; export it "
                         "as a SavedModel, whose graph puts them back in order.")
    model = source.load_model(Transformer, checkpoint=checkpoint)
    weights = {weight_key(w.path): np.asarray(w.numpy(), np.float32)
               for w in model.weights}
    return model.model_config, weights, record, source.spm_bytes, source


def _decoding(record, model: ModelConfig, options: dict) -> DecodingOptions:
    """The decoding options of the export: `options` given, else the source export's,
    else the run's training length for the two limits, else the defaults; the limits
    capped by the model's positions (as tfxformer.serving.Translator does)."""
    given = {k: v for k, v in options.items() if v is not None}
    base = record.decoding or DecodingOptions().replace(
        max_input_tokens=record.max_length, max_output_tokens=record.max_length)
    decoding = base.replace(**given).validate()
    return decoding.replace(
        max_input_tokens=min(decoding.max_input_tokens, model.max_positions),
        max_output_tokens=min(decoding.max_output_tokens, model.max_positions))


def _pieces(spm_bytes: bytes) -> list[str]:
    processor = sentencepiece.SentencePieceProcessor(model_proto=spm_bytes)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def _marker(record, source, spm_bytes: bytes) -> dict:
    """The tfxformer.json entries that describe the source: format, languages, preset,
    vocabulary hash and where it came from (no machine path)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "src": record.src,
            "tgt": record.tgt, "preset": record.preset,
            "vocabulary_sha256": hashlib.sha256(spm_bytes).hexdigest(),
            "source": {"kind": source.kind, "name": locate.source_name(source.path)}}


def _check_target(directory: str) -> None:
    if os.path.isfile(directory) or (os.path.isdir(directory) and os.listdir(directory)):
        raise FileExistsError(f"{directory!r} exists and is not an empty directory; give a "
                              "new directory for the CTranslate2 model (nothing is "
                              "overwritten).")


def export_ctranslate2(path, directory, quantization=None, checkpoint=None,
                       **options) -> str:
    """Converts the trained model at `path` into a CTranslate2 model directory.

    Args:
        path: a SavedModel export or version dir, a run dir (averaged checkpoint first,
            or `checkpoint`) or a preset dir of this package.
        directory: the new directory (must not exist, or be empty). It is written in a
            temporary directory beside it and renamed into place when complete.
        quantization: how CTranslate2 stores the weights, one of :data:`QUANTIZATIONS`
            (None: float32). int8 is CTranslate2's fast CPU type.
        options: decoding options (:class:`tfxformer.config.DecodingOptions` names:
            beam_size, alpha, extra_length, batch_size, max_input_tokens,
            max_output_tokens, stopping, length_normalization), recorded for
            :mod:`tfxformer.serving.ctranslate2`; None or absent: the source export's,
            else the run's training length for the limits, else the defaults.

    Returns:
        `directory`.

    Raises:
        ImportError: CTranslate2 is not installed (the message says how to install it).
        FileNotFoundError, ValueError: as :func:`tfxformer.locate.resolve` and the
            loaders; a multilingual model, an ensemble, or a bad option.
        FileExistsError: `directory` holds something.
    """
    ctranslate2 = import_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not one of {list(QUANTIZATIONS)}.")
    directory = os.fspath(directory)
    _check_target(directory)
    model, weights, record, spm_bytes, source = _loaded(path, checkpoint)
    decoding = _decoding(record, model, options)
    spec = build_spec(model, weights, _pieces(spm_bytes))
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".ct2-", dir=parent)
    try:
        save_spec(spec, os.path.join(work, "model"), quantization)
        with open(os.path.join(work, "model", SPM_FILENAME), "wb") as f:
            f.write(spm_bytes)
        marker = dict(_marker(record, source, spm_bytes), model=model.to_dict(),
                      decoding=decoding.to_dict(), quantization=quantization or "float32",
                      ctranslate2_version=ctranslate2.__version__)
        with open(os.path.join(work, "model", MARKER_FILENAME), "w", encoding="utf-8") as f:
            json.dump(marker, f, indent=2, sort_keys=True)
        if os.path.isdir(directory):
            os.rmdir(directory)  # empty (checked): replaced by the finished one
        os.replace(os.path.join(work, "model"), directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory
