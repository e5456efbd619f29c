"""Attention weights of one translated sentence, drawn per layer and head (§3.2, Figure 3–5).

The paper's appendix shows encoder self-attention heads "exhibiting behaviour that seems
related to the structure of the sentence". :func:`sentence_attention` translates one
sentence greedily and collects every attention matrix; :func:`plot_attention` draws
them to a PNG with matplotlib's Agg backend, tokens as axis labels.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from tfxformer.decoding import greedy_decode
from tfxformer.decoding.common import DEFAULTS
from tfxformer.ids import BOS_ID, EOS_ID

KINDS = ("encoder", "decoder", "cross")
_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
           "cross": "encoder-decoder attention"}


class SentenceAttention(NamedTuple):
    """Tokens and weights of one sentence. `weights[kind]` is a list over layers of
    (H, queries, keys) arrays: "encoder" (H, S, S), "decoder" (H, T, T), "cross" (H, T, S).
    Decoder query t is the step that produced `target_tokens[t]`; its self-attention keys
    are the decoder inputs `decoder_input_tokens` (BOS, then the output shifted right)."""

    source_tokens: list
    target_tokens: list
    decoder_input_tokens: list
    weights: dict


def sentence_attention(model, spm_bytes: bytes, sentence: str,
                       extra_length=DEFAULTS.extra_length):
    """Greedy-translates `sentence` and returns its :class:`SentenceAttention`.

    `model` is a :class:`tfxformer.Transformer` (e.g. from
    :func:`tfxformer.pretrained.load_run_dir`),
    `spm_bytes` its vocabulary; the source is cut to the model's position table.
    """
    processor = spm.SentencePieceProcessor(model_proto=spm_bytes)
    limit = model.model_config.max_positions
    source = processor.encode(sentence)[: limit - 1] + [EOS_ID]
    source_ids = tf.constant([source], tf.int32)
    output = greedy_decode(model, source_ids, extra_length=extra_length)
    target = output.ids[0, : int(output.lengths[0])].numpy().tolist()
    decoder_inputs = tf.constant([[BOS_ID] + target[:-1]], tf.int32)
    memory, mask, encoder = model.encode(source_ids, return_attention_scores=True)
    _, decoder = model.decode(decoder_inputs, memory, mask, return_attention_scores=True)
    weights = {"encoder": [np.asarray(w[0]) for w in encoder],
               "decoder": [np.asarray(w["self"][0]) for w in decoder],
               "cross": [np.asarray(w["cross"][0]) for w in decoder]}
    pieces = processor.id_to_piece
    return SentenceAttention([pieces(i) for i in source], [pieces(i) for i in target],
                             [pieces(i) for i in decoder_inputs[0].numpy()], weights)


def _axis_tokens(attention, kind):
    """(row labels, column labels) of one kind of attention."""
    source, target = attention.source_tokens, attention.target_tokens
    return {"encoder": (source, source), "decoder": (target, attention.decoder_input_tokens),
            "cross": (target, source)}[kind]


def plot_attention(attention, path, kinds=KINDS, layers=None, cell_inches=2.6, dpi=100):
    """Draws the chosen kinds of attention, one row per (kind, layer), one column per head.

    Args:
        attention: a :class:`SentenceAttention`.
        path: output PNG file.
        kinds: any of "encoder", "decoder", "cross".
        layers: layer indices to draw (default all).
    Returns:
        `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"Unknown attention kinds {unknown or kinds!r}; accepted: {KINDS}.")
    num_layers = len(attention.weights[kinds[0]])
    layers = list(range(num_layers)) if layers is None else list(layers)
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad or not layers:
        raise ValueError(f"Layers {bad or layers} out of range; the model has {num_layers}.")
    rows = [(kind, i) for kind in kinds for i in layers]
    heads = attention.weights[kinds[0]][0].shape[0]
    fig, axes = plt.subplots(len(rows), heads, squeeze=False,
                             figsize=(cell_inches * heads, cell_inches * len(rows)))
    for (kind, layer), row_axes in zip(rows, axes, strict=True):
        row_labels, column_labels = _axis_tokens(attention, kind)
        for head, ax in enumerate(row_axes):
            ax.imshow(attention.weights[kind][layer][head], cmap="viridis", vmin=0.0, vmax=1.0,
                      aspect="auto")
            ax.set_title(f"{_TITLES[kind]}\nlayer {layer + 1}, head {head + 1}", fontsize=7)
            _label(ax, row_labels, column_labels)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _label(ax, row_labels, column_labels, max_labels=60):
    """Token tick labels; a sentence longer than `max_labels` keeps plain indices."""
    row_labels, column_labels = ([t.replace("$", r"\$") for t in labels]  # no mathtext
                                 for labels in (row_labels, column_labels))
    fontsize = max(3, 7 - len(column_labels) // 15)
    if len(column_labels) <= max_labels:
        ax.set_xticks(range(len(column_labels)))
        ax.set_xticklabels(column_labels, rotation=90, fontsize=fontsize)
    if len(row_labels) <= max_labels:
        ax.set_yticks(range(len(row_labels)))
        ax.set_yticklabels(row_labels, fontsize=fontsize)
