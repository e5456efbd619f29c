"""Word alignments of given sentence pairs, read from a trained model's attention.

What guided alignment (Garg et al., 2019; `train_wmt.py --guided-alignment`) trains on
when no external aligner is at hand: each pair is read by the model teacher-forced, and
each target piece is linked to the source piece its alignment attention weighs most
(:func:`tfxformer.serving.alignment.align_rows`, the reading `translate_nbest` gives its
own translations); a second model of the reverse direction reads the swapped pairs, and
:func:`tfxformer.data.alignments.symmetrize` combines the two (grow-diag-final-and by
default), as statistical aligners' two directions are. `scripts/align.py` runs it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import tensorflow as tf

from tfxformer.data import alignments
from tfxformer.data.tokenizer import sentencepiece_tokenizer
from tfxformer.ids import EOS_ID
from tfxformer.serving.alignment import align_rows

__all__ = ["PairAligner", "symmetrized"]

_READ_AHEAD = 16  # batches read ahead and sorted by length, to batch well


class PairAligner:
    """Aligns (source, target) pairs with `model` (a :class:`tfxformer.Transformer`),
    `spm_bytes` its vocabulary: each side cut to the model's `max_positions` pieces
    (EOS included); `reverse_target` for a right-to-left model."""

    def __init__(self, model, spm_bytes: bytes, batch_size: int = 64,
                 reverse_target: bool = False):
        self.model, self.batch_size = model, int(batch_size)
        self.tokenizer = sentencepiece_tokenizer(spm_bytes)
        self.limit = model.model_config.max_positions - 1
        ids = tf.TensorSpec([None, None], tf.int32)
        self._align = tf.function(
            lambda source, target: align_rows(model, source, target, self.tokenizer,
                                              reverse_target=reverse_target),
            input_signature=[ids, ids], autograph=False)

    def _ids(self, texts):
        """(B,) texts -> (B, L) ids: pieces (cut), EOS, PAD."""
        pieces = self.tokenizer.tokenize(tf.constant(texts))[:, :self.limit]
        eos = tf.fill([pieces.nrows(), 1], EOS_ID)
        return tf.concat([tf.cast(pieces, tf.int32), eos], axis=1).to_tensor()

    def align(self, sources: list, targets: list) -> list[str]:
        """One Pharaoh line per pair (source word i, target word j)."""
        out = self._align(self._ids(sources), self._ids(targets))
        return [line.decode("utf-8") for line in out.numpy()]

    def stream(self, pairs: Iterable[tuple]) -> Iterator[str]:
        """The Pharaoh line of each pair of `pairs`, in order (read ahead, batched by
        length)."""
        pairs = iter(pairs)
        while buffer := list(itertools.islice(pairs, self.batch_size * _READ_AHEAD)):
            order = sorted(range(len(buffer)), key=lambda k: len(buffer[k][0]))
            lines = [""] * len(buffer)
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                aligned = self.align([buffer[k][0] for k in chunk], [buffer[k][1] for k in chunk])
                for k, line in zip(chunk, aligned, strict=True):
                    lines[k] = line
            yield from lines


def symmetrized(forward: Iterable[str], backward: Iterable[str],
                heuristic: str = "grow-diag-final-and") -> Iterator[str]:
    """Pharaoh lines of both directions -> the symmetrized ones: `forward` the
    source-to-target model's (i-j), `backward` the target-to-source model's of the swapped
    pairs (its j-i)."""
    for ahead, back in zip(forward, backward, strict=True):
        swapped = {(i, j) for j, i in alignments.read_links(back)}
        yield alignments.write_links(alignments.symmetrize(alignments.read_links(ahead),
                                                           swapped, heuristic))
