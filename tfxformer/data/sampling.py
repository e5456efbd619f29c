"""Subword regularisation of the training text: BPE-dropout segmentations, seeded.

Kudo (2018), "Subword Regularization": segment each training sentence anew every time it is
read, so that the model sees many segmentations of the same words; translate with the
deterministic one. Provilkov et al. (2020), "BPE-Dropout": for a BPE vocabulary, "randomly
drop some merges from the BPE merge table" while segmenting; with a merge-dropout
probability p = 0.1 they report up to +2.3 BLEU over plain BPE.

What SentencePiece does with a BPE model (its `SampleEncode`, which tensorflow-text's
`SentencepieceTokenizer(nbest_size=..., alpha=...)` and the `sentencepiece` package's
`encode(..., enable_sampling=True)` both call): `nbest_size` is ignored (it only selects
sampling: tensorflow-text runs the deterministic `Encode` for `nbest_size` 0 or 1; -1 is
passed here), and `alpha` is the BPE-dropout probability: every time the merge loop takes
the best-scoring adjacent pair, it skips that merge with probability `alpha` (the pair is
not tried again unless a neighbour changes). `alpha` 0 is the deterministic segmentation,
exactly; 1 leaves every character unmerged (byte pieces where a character is not in the
vocabulary). User-defined pieces (the target tags of :mod:`tfxformer.multilingual`) are
never split.

Why not tensorflow-text's sampling op: it draws from the generator of whichever TensorFlow
worker thread runs it, seeded from `std::random_device` (SentencePiece's thread-local
`std::mt19937`); no seed reaches it, so two runs, two workers of one run, or a resumed run
and an uninterrupted one would see different segmentations. Here each batch is segmented
by the `sentencepiece` package (the same C++ algorithm) in a new thread, right after
`sentencepiece.set_random_generator_seed(s)`, with `s` derived from the sampler's seed and
the batch's position in the training stream: the same seed gives the same segmentations,
a later epoch (later positions) gives others, and a run resumed from a checkpoint of its
tf.data iterator (which saves the position) sees what an uninterrupted one would.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from tfxformer import checks

__all__ = ["SubwordSampler", "check_alpha"]

# SentencePiece's "no seed given" value: set_random_generator_seed ignores it.
_UNSEEDED = 0xFFFFFFFF
# One process-wide SentencePiece seed: a sampling call holds it from setting the seed until
# its thread has drawn everything.
_SEED_LOCK = threading.Lock()


def check_alpha(alpha, name: str = "subword_sampling") -> float:
    """`alpha` as a float in [0, 1), or ValueError naming `name` and the accepted range
    (1 would drop every merge: character-level text, not regularisation)."""
    alpha = checks.number(alpha, name, 0.0, 1.0)
    if alpha >= 1.0:
        raise ValueError(f"`{name}` must be a merge-dropout probability in [0, 1), got "
                         f"{alpha!r} (1 drops every merge: characters only).")
    return alpha


def _model_type(spm_bytes: bytes) -> str:
    """The SentencePiece model type of `spm_bytes` ("BPE", "UNIGRAM", ...)."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.ParseFromString(spm_bytes)
    return model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)


class SubwordSampler:
    """BPE-dropout segmentations of strings (Provilkov et al., 2020), reproducible from a
    seed: the same `(seed, position)` and strings always give the same ids.

    The ids are those of :meth:`tfxformer.data.Tokenizer.tokenize` (no BOS/EOS); with
    `alpha` 0 they are equal to them. For training text only: validation, evaluation and
    the exported translator segment deterministically.

    Args:
        spm_bytes: the SentencePiece BPE model (`Tokenizer.spm_bytes`).
        alpha: the merge-dropout probability p, in [0, 1) (Provilkov et al.: 0.1).
        seed: the base seed; None draws one (segmentations then differ between runs).

    Raises:
        ValueError: `alpha` out of range, or the model is not a BPE model.

    Example:

    >>> sampler = SubwordSampler(tokenizer.spm_bytes, alpha=0.1, seed=0)
    >>> sampler.sample(["A dog runs."], position=0)            # [[ids...]]
    >>> sampler.tokenize(tf.constant(["A dog runs."]), 0)       # RaggedTensor (1, None)
    """

    def __init__(self, spm_bytes: bytes, alpha: float, seed: int | None = 0):
        self.alpha = check_alpha(alpha, "alpha")
        spm_bytes = bytes(spm_bytes)
        kind = _model_type(spm_bytes)
        if kind != "BPE":
            raise ValueError(f"Subword sampling here is BPE-dropout, but the vocabulary is a "
                             f"{kind} SentencePiece model; use a BPE vocabulary "
                             "(tfxformer.data.train_tokenizer makes one).")
        self.seed = int(np.random.SeedSequence().entropy if seed is None else seed)
        self._processor = spm.SentencePieceProcessor(model_proto=spm_bytes)

    def batch_seed(self, position: int) -> int:
        """The SentencePiece seed of the batch at `position`: 32 bits mixed from the base
        seed and `position` (numpy's SeedSequence), never SentencePiece's "unseeded"."""
        entropy = [self.seed % (1 << 64), int(position) % (1 << 64)]
        value = int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])
        return value if value != _UNSEEDED else _UNSEEDED - 1

    def sample(self, texts, position: int) -> list[list[int]]:
        """One sampled segmentation (ids) of each of `texts` (str or UTF-8 bytes), drawn
        in order from the stream of `batch_seed(position)`."""
        texts = list(texts)
        result: list = []

        # One encode() per text, not encode(list): the list form starts a C++ thread of its
        # own, which aborts the process when Python exits while a tf.data map is inside it.
        def run():  # a new thread: its SentencePiece generator starts from the seed
            try:
                result.extend(self._processor.encode(
                    text, out_type=int, enable_sampling=True, nbest_size=-1,
                    alpha=self.alpha) for text in texts)
            except BaseException as error:  # re-raised in the caller's thread
                result[:] = [error]

        with _SEED_LOCK:
            spm.set_random_generator_seed(self.batch_seed(position))
            thread = threading.Thread(target=run, name="tfxformer-subword-sampling")
            thread.start()
            thread.join()
        if result and isinstance(result[0], BaseException):
            raise result[0]
        return result

    def at(self, position) -> _Positioned:
        """This sampler for the batch at `position` (an int scalar tensor): an object whose
        `tokenize(strings)` is :meth:`tokenize` at that position, where a
        :class:`tfxformer.data.Tokenizer` is expected (one call per batch: each call at
        one position draws the same stream)."""
        return _Positioned(self, position)

    def _sample_arrays(self, texts: np.ndarray, position) -> tuple[np.ndarray, np.ndarray]:
        rows = self.sample(texts.tolist(), int(position))
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        ids = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
        return ids, lengths

    def tokenize(self, strings, position) -> tf.RaggedTensor:
        """In the graph (e.g. a tf.data map): sampled ids of `strings`, a 1-D tf.string
        tensor `(N,)`, as an int32 RaggedTensor `(N, None)`; `position` is an int scalar
        (tensor) naming the batch, e.g. its index in the training stream."""
        strings = tf.convert_to_tensor(strings, tf.string)
        # Stateless: the output is a function of the inputs (the seed comes from them).
        ids, lengths = tf.numpy_function(
            self._sample_arrays, [strings, tf.cast(position, tf.int64)],
            [tf.int32, tf.int64], stateful=False, name="subword_sampling")
        ids.set_shape([None])
        lengths.set_shape(strings.shape)
        return tf.RaggedTensor.from_row_lengths(ids, lengths, validate=False)


class _Positioned:
    """A :class:`SubwordSampler` at one batch position (:meth:`SubwordSampler.at`)."""

    def __init__(self, sampler: SubwordSampler, position):
        self.sampler, self.position = sampler, position

    def tokenize(self, strings) -> tf.RaggedTensor:
        return self.sampler.tokenize(strings, self.position)
