"""Shared source/target subword vocabulary (§5.1) with SentencePiece BPE.

§5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens." One SentencePiece BPE model is trained on the source
*and* target training text and used for both sides.

The model is trained with the fixed ids of :mod:`tfxformer.ids` (pad 0, unk 1, bos 2,
eos 3), which are also the ids that keras-hub's `compute_sentence_piece_proto` assigns, so
a model trained here works with `keras_nlp.tokenizers.SentencePieceTokenizer` (see
:func:`keras_tokenizer`).

Departure from the brief's suggestion: keras-hub 0.32's `compute_sentence_piece_proto`
accepts no extra trainer arguments (no `character_coverage`, `byte_fallback`,
`input_sentence_size`), so :func:`train_tokenizer` calls `sentencepiece.SentencePieceTrainer`
(the library keras-hub wraps) directly, with the same ids.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import io
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import sentencepiece as spm
import tensorflow as tf

from tfxformer import pretrained
from tfxformer.ids import BOS_ID, EOS_ID, NUM_SPECIAL_IDS, PAD_ID, SPM_FILENAME, UNK_ID  # noqa: F401
from tfxformer.sentencepiece_ops import load_sentencepiece_ops  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    import tensorflow_text as tf_text

__all__ = [
    "MODEL_FILENAME", "Tokenizer", "keras_tokenizer", "load_vocabulary", "train_tokenizer",
]

MODEL_FILENAME = SPM_FILENAME

logger = logging.getLogger(__name__)


def _check_proto(proto: bytes) -> int:
    """Returns the vocabulary size of `proto`, or raises if it breaks the id contract."""
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as err:
        raise ValueError(f"Not a SentencePiece model proto ({len(proto)} bytes): {err}") from None
    ids = dict(pad=processor.pad_id(), unk=processor.unk_id(), bos=processor.bos_id(),
               eos=processor.eos_id())
    expected = dict(pad=PAD_ID, unk=UNK_ID, bos=BOS_ID, eos=EOS_ID)
    if ids != expected:
        raise ValueError(
            f"SentencePiece model has special ids {ids}; tfxformer requires {expected}. "
            "Train it with tfxformer.data.train_tokenizer."
        )
    return processor.GetPieceSize()


@functools.cache
def _tokenizer_class():
    """`SharedNameSentencepieceTokenizer`, defined on first use: importing tensorflow-text
    loads every one of its op libraries (~110 MiB resident), which a process that only
    serves a SavedModel does not need (:func:`load_sentencepiece_ops`)."""
    import tensorflow_text as tf_text
    from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer

    class _SharedModelResource(tf.saved_model.experimental.TrackableResource):
        """The SentencePiece model resource, shared by name (one per distinct model)."""

        def __init__(self, spm_bytes: bytes):
            super().__init__()
            self._spm_bytes = spm_bytes
            self._shared_name = f"tfxformer_spm_{hashlib.sha256(spm_bytes).hexdigest()[:24]}"
            _ = self.resource_handle  # Creates the resource now, as tensorflow-text does.

        def _create_resource(self):
            return gen_sentencepiece_tokenizer.sentencepiece_op(
                model=self._spm_bytes, shared_name=self._shared_name)

    class SharedNameSentencepieceTokenizer(tf_text.SentencepieceTokenizer):
        """`tensorflow_text.SentencepieceTokenizer` (its defaults, int32 ids) over a model
        resource shared by name instead of one owned by the kernel that creates it."""

        def __init__(self, spm_bytes: bytes):
            # The parent's __init__ would create the kernel-owned resource; set what it sets.
            super(tf_text.SentencepieceTokenizer, self).__init__()
            parameters = inspect.signature(tf_text.SentencepieceTokenizer.__init__).parameters
            for name, parameter in parameters.items():
                if name not in ("self", "model", "name"):
                    setattr(self, name, parameter.default)
            self.out_type = tf.int32
            self._model_resource = _SharedModelResource(spm_bytes)

    return SharedNameSentencepieceTokenizer


def sentencepiece_tokenizer(spm_bytes: bytes) -> tf_text.SentencepieceTokenizer:
    """The tensorflow-text SentencePiece tokenizer of `spm_bytes`, int32 ids: the one place
    tfxformer makes one (the :class:`Tokenizer` and the exported translator use it).

    tensorflow-text makes the model resource owned by the kernel of the op that creates
    it (b/318839908), and `tf.random.set_seed` / `keras.utils.set_random_seed` destroy
    that kernel by clearing the eager kernel cache ("Resource ..._0_SentencepieceOp...
    does not exist", tensorflow/text issue 570). This resource is named after the model's
    SHA-256 and lives in the resource manager instead. Made eagerly, it survives the
    cache clearing; made inside a `tf.function`, the op is part of that graph (so a
    SavedModel needs no resource object).
    """
    return _tokenizer_class()(bytes(spm_bytes))


def load_vocabulary(path: str) -> Tokenizer:
    """Loads `spm.model` (a file, or a run dir holding one) as a :class:`Tokenizer`, with a
    clear error for a missing or corrupt file."""
    try:
        return Tokenizer.load(path)
    except FileNotFoundError:
        raise
    except Exception as error:  # SentencePiece raises several types for a bad proto
        file = os.path.join(path, MODEL_FILENAME) if os.path.isdir(path) else path
        raise ValueError(f"{file} is not a valid SentencePiece model ({error}); restore it, "
                         "or train into a new run dir (`model_dir`).") from error


class Tokenizer(tf.Module):
    """In-graph SentencePiece tokenizer over the shared EN/DE vocabulary (§5.1).

    Wraps `tensorflow_text.SentencepieceTokenizer`, so `tokenize` and `detokenize` run
    inside `tf.data` pipelines, `tf.function`s and exported SavedModels (the model proto is
    embedded in the graph). Special ids follow the module's contract (pad 0, unk 1, bos 2,
    eos 3); `tokenize` never adds them: the data pipeline does (see
    `tfxformer.data.pipeline`).

    Args:
        spm_bytes: serialized SentencePiece `ModelProto` bytes (the content of `spm.model`).
        name: name of the `tf.Module`.

    Example:

    >>> tok = Tokenizer.load("runs/base")            # runs/base/spm.model
    >>> ids = tok.tokenize(["Ein Hund läuft."])       # RaggedTensor (1, None) int32
    >>> tok.detokenize(ids)                           # [b"Ein Hund l\\xc3\\xa4uft."]
    """

    def __init__(self, spm_bytes: bytes, name: str = "tokenizer"):
        super().__init__(name=name)
        spm_bytes = bytes(spm_bytes)
        self._vocab_size = _check_proto(spm_bytes)
        self._spm_bytes = spm_bytes
        self._sp = sentencepiece_tokenizer(spm_bytes)  # survives tf.random.set_seed

    @classmethod
    def load(cls, path: str) -> Tokenizer:
        """Loads `path`: an `spm.model` file, or a (run) directory that contains one."""
        file = os.path.join(path, MODEL_FILENAME) if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"No SentencePiece model at {file!r}: expected an {MODEL_FILENAME} file, or a "
                f"directory containing {MODEL_FILENAME} (written by train_tokenizer/save)."
            )
        with open(file, "rb") as f:
            return cls(f.read())

    @classmethod
    def from_preset(cls, path: str) -> Tokenizer:
        """The vocabulary of the trained model at `path` (a SavedModel export or version
        dir, a run dir, or a preset dir; :mod:`tfxformer.pretrained`): the same ids as
        the model was trained with."""
        return pretrained.load_tokenizer(cls, path)

    def save(self, directory: str) -> str:
        """Writes the model to `directory/spm.model` and returns that path."""
        os.makedirs(directory, exist_ok=True)
        file = os.path.join(directory, MODEL_FILENAME)
        with open(file, "wb") as f:
            f.write(self._spm_bytes)
        return file

    @property
    def spm_bytes(self) -> bytes:
        """The serialized SentencePiece model (the content of `spm.model`)."""
        return self._spm_bytes

    @property
    def vocab_size(self) -> int:
        """Number of ids, special ids 0-3 included (the model's embedding rows)."""
        return self._vocab_size

    def tokenize(self, strings) -> tf.Tensor | tf.RaggedTensor:
        """Encodes UTF-8 `strings` into subword ids, without BOS/EOS.

        Args:
            strings: string tensor (or Python str / list of str) of shape `[...]`.

        Returns:
            int32 ids of shape `[..., None]`: a RaggedTensor for batched input, a 1-D
            Tensor for a scalar string.
        """
        return self._sp.tokenize(strings)

    def detokenize(self, ids) -> tf.Tensor:
        """Decodes ids back to UTF-8 strings, ignoring special ids.

        Each row is cut at its first EOS (id 3; the EOS and everything after it are
        dropped), then the remaining PAD/UNK/BOS ids (0, 1, 2) are dropped, so padded
        decoder outputs and beam-search outputs can be passed as they are. Dropping UNK
        (instead of SentencePiece's " ⁇ ") only matters for models without byte fallback.

        Args:
            ids: integer ids of shape `[..., T]`, a Tensor (padded with 0) or a
                RaggedTensor.

        Returns:
            tf.string tensor of shape `[...]`. `detokenize(tokenize(s)) == s` up to
            SentencePiece normalisation (NFKC, runs of whitespace collapsed, leading and
            trailing whitespace removed).
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        seen_eos = tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1) > 0
        keep = tf.logical_and(tf.logical_not(seen_eos), ids >= NUM_SPECIAL_IDS)
        text = self._sp.detokenize(tf.ragged.boolean_mask(ids, keep))
        # For ids of rank > 2 (e.g. beams (B, K, T)) the strings come back ragged-typed.
        return text.to_tensor() if isinstance(text, tf.RaggedTensor) else text

    def id_to_piece(self, ids) -> tf.Tensor:
        """Returns the vocabulary piece (tf.string) of each id, e.g. 0 -> b"<pad>"."""
        return self._sp.id_to_string(ids)


def _sentences(texts: Iterable[str], max_bytes: int, stats: dict) -> Iterator[str]:
    """Yields the lines to train on; skips over-long ones and logs progress."""
    for line in texts:
        stats["seen"] += 1
        if stats["seen"] % 1_000_000 == 0:
            logger.info("SentencePiece: read %d lines", stats["seen"])
        if len(line.encode("utf-8")) > max_bytes:
            stats["too_long"] += 1
            continue
        yield line


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 37_000,
    *,
    save_dir: str | None = None,
    max_sentences: int = 3_000_000,
    character_coverage: float = 1.0,
    byte_fallback: bool = True,
    max_sentence_bytes: int = 4192,
    seed: int = 0,
    num_threads: int | None = None,
    user_defined_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Trains the shared BPE vocabulary (§5.1: ~37000 tokens for EN-DE) on `texts`.

    Args:
        texts: training lines of BOTH languages, e.g. `Corpus.training_text()`. Read once,
            in one pass, so a generator over millions of lines is fine.
        vocab_size: number of ids including the 4 special ids (and the 256 byte pieces
            when `byte_fallback`).
        save_dir: if given, the model is also written to `save_dir/spm.model`.
        max_sentences: SentencePiece `input_sentence_size`: at most this many lines,
            sampled uniformly (reservoir) from `texts`, are used, so memory and time stay
            bounded on large corpora.
        character_coverage: 1.0 keeps every character of EN/DE text in the vocabulary.
        byte_fallback: spell characters outside the vocabulary as UTF-8 byte pieces
            instead of UNK, so no text is lost.
        max_sentence_bytes: lines longer than this (in UTF-8 bytes) are skipped.
        seed: SentencePiece's random seed (sampling and shuffling).
        num_threads: trainer threads; defaults to the CPU count (at most 16).
        user_defined_symbols: strings that are always one piece each, wherever they
            occur (e.g. the target tags of :mod:`tfxformer.multilingual`).

    Returns:
        The trained :class:`Tokenizer`.

    Raises:
        ValueError: SentencePiece rejected the settings, e.g. `vocab_size` larger than
            what the text supports or smaller than the required characters.
    """
    stats = dict(seen=0, too_long=0)
    spm.set_random_generator_seed(seed)
    writer = io.BytesIO()
    start = time.time()
    logger.info("SentencePiece: training BPE, vocab_size=%d, on up to %d sampled lines",
                vocab_size, max_sentences)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(texts, max_sentence_bytes, stats),
            model_writer=writer, model_type="bpe", vocab_size=vocab_size,
            character_coverage=character_coverage, byte_fallback=byte_fallback,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            input_sentence_size=max_sentences, shuffle_input_sentence=True,
            max_sentence_length=max_sentence_bytes,
            user_defined_symbols=list(user_defined_symbols),
            num_threads=num_threads or min(os.cpu_count() or 1, 16), minloglevel=1,
        )
    except RuntimeError as err:
        raise ValueError(
            f"SentencePiece training failed (vocab_size={vocab_size}, {stats['seen']} lines): "
            f"{err}"
        ) from None
    tokenizer = Tokenizer(writer.getvalue())
    logger.info(
        "SentencePiece: trained %d pieces from %d lines (%d sampled at most, %d skipped as "
        "longer than %d bytes) in %.1f s", tokenizer.vocab_size, stats["seen"], max_sentences,
        stats["too_long"], max_sentence_bytes, time.time() - start,
    )
    if save_dir is not None:
        logger.info("SentencePiece: saved %s", tokenizer.save(save_dir))
    return tokenizer


def keras_tokenizer(tokenizer: Tokenizer | bytes | str):
    """Returns `keras_nlp.tokenizers.SentencePieceTokenizer` over the same model.

    For Keras preprocessing layers. It gives the same ids as :meth:`Tokenizer.tokenize`,
    but its `detokenize` keeps special ids (no EOS cut), and its model resource does not
    survive `tf.random.set_seed` (tensorflow/text issue 570; create it after seeding).
    `tokenizer` may be a :class:`Tokenizer`, the bytes of `spm.model`, or a path accepted
    by :meth:`Tokenizer.load`.
    """
    import keras_nlp  # Imported here: keras-hub is slow to import and optional at runtime.

    if isinstance(tokenizer, str):
        tokenizer = Tokenizer.load(tokenizer)
    spm_bytes = tokenizer.spm_bytes if isinstance(tokenizer, Tokenizer) else bytes(tokenizer)
    return keras_nlp.tokenizers.SentencePieceTokenizer(proto=spm_bytes)
