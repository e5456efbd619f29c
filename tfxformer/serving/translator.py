"""String-to-string translation in one TensorFlow graph (§6.1 decoding), ready to export.

Shapes: N input strings, B sentences of one chunk, S source length, K beam size.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.data.tokenizer import sentencepiece_tokenizer
from tfxformer.decoding import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    EOS_ID,
    beam_search,
)

DEFAULT_MAX_BATCH_SIZE = 64
# Raw input is cut to this many characters per allowed token before tokenizing, so a
# huge string costs little: a BPE piece spans at most 16 characters (SentencePiece's
# default max_sentencepiece_length), and runs of whitespace are collapsed.
CHARS_PER_TOKEN = 64
REPLACEMENT_CHAR = 0xFFFD  # U+FFFD, in place of invalid UTF-8

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
OPTION_SPECS = (tf.TensorSpec([], tf.int32, name="beam_size"),
                tf.TensorSpec([], tf.float32, name="alpha"),
                tf.TensorSpec([], tf.int32, name="extra_length"))


def sanitize_utf8(text):
    """(N,) strings -> valid UTF-8, invalid bytes replaced by U+FFFD (core TF op)."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=REPLACEMENT_CHAR)


def _positive_int(value, name):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return int(value)


class Translator(tf.Module):
    """Translates a batch of strings: tokenize → encode → beam search → detokenize (§6.1).

    Everything runs in the graph of a `tf.function`, so the module exports as a
    SavedModel that needs only TensorFlow and tensorflow-text (see
    :func:`tfxformer.serving.export_translator`). SentencePiece runs in-graph
    (`tensorflow_text.SentencepieceTokenizer`, the model bytes embedded). Each source
    is its pieces, cut to the model's `max_length` positions, then EOS. Inputs are
    sorted by token length and translated in chunks of `max_batch_size` (little
    padding); outputs come back in input order.

    Any input is accepted: invalid UTF-8 is replaced by U+FFFD before tokenizing, empty
    or whitespace-only strings translate from a lone EOS, over-long ones are cut, an
    empty batch gives empty outputs. Each output is valid UTF-8.

    Args:
        model: a built or unbuilt :class:`tfxformer.Transformer` with trained weights.
        sentencepiece_model: the bytes of `spm.model` (ids pad 0, unk 1, bos 2, eos 3).
        beam_size, alpha, extra_length: decoding defaults (4, 0.6, 50: §6.1).
        max_batch_size: sentences decoded together (default 64).
        max_input_length: source tokens kept, EOS included (default and upper bound:
            the model's `max_length`).

    Call (`__call__`, signature `serving_default`):
        text: (N,) tf.string. Returns {"translation": (N,) tf.string, "score": (N,)
        float32}, the score being log P(Y | X) / lp(Y) of the best hypothesis.
    `translate_with_options(text, beam_size, alpha, extra_length)` takes the options as
    scalar tensors (int32, float32, int32) and returns the same.

    Example:
    >>> translator = Translator(model, open("runs/base/spm.model", "rb").read())
    >>> translator(tf.constant(["A dog runs."]))["translation"]
    """

    def __init__(self, model, sentencepiece_model: bytes, beam_size=DEFAULT_BEAM_SIZE,
                 alpha=DEFAULT_ALPHA, extra_length=DEFAULT_EXTRA_LENGTH,
                 max_batch_size=DEFAULT_MAX_BATCH_SIZE, max_input_length=None,
                 name="translator"):
        super().__init__(name=name)
        if not isinstance(sentencepiece_model, bytes) or not sentencepiece_model:
            raise ValueError("`sentencepiece_model` must be the non-empty bytes of spm.model, "
                             f"got {type(sentencepiece_model).__name__}.")
        if not model.built:
            model.build()
        self.model = model
        self.sentencepiece_model = sentencepiece_model  # also written as an export asset
        self.beam_size = _positive_int(beam_size, "beam_size")
        if not float(alpha) >= 0.0:
            raise ValueError(f"`alpha` (length penalty exponent) must be >= 0, got {alpha!r}.")
        self.alpha = float(alpha)
        if isinstance(extra_length, bool) or int(extra_length) != extra_length \
                or extra_length < 0:
            raise ValueError(f"`extra_length` must be an integer >= 0, got {extra_length!r}.")
        self.extra_length = int(extra_length)
        self.max_batch_size = _positive_int(max_batch_size, "max_batch_size")
        positions = int(model.model_config["max_length"])
        self.max_input_length = positions if max_input_length is None else min(
            positions, _positive_int(max_input_length, "max_input_length"))

    @tf.function(input_signature=[TEXT_SPEC])
    def __call__(self, text):
        return self.translate(text)

    @tf.function(input_signature=[TEXT_SPEC, *OPTION_SPECS])
    def translate_with_options(self, text, beam_size, alpha, extra_length):
        return self.translate(text, beam_size, alpha, extra_length)

    def translate(self, text, beam_size=None, alpha=None, extra_length=None):
        """The graph behind both signatures; options default to the constructor's."""
        options = dict(
            beam_size=self.beam_size if beam_size is None else beam_size,
            alpha=self.alpha if alpha is None else alpha,
            extra_length=self.extra_length if extra_length is None else extra_length)
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        tokenizer = self.make_tokenizer()
        pieces = self.tokenize(text, tokenizer)  # (N, None) ragged, EOS-terminated
        order = tf.argsort(pieces.row_lengths(), direction="DESCENDING", stable=True)
        translations, scores = self._translate_sorted(tf.gather(pieces, order), options,
                                                      tokenizer)
        inverse = tf.math.invert_permutation(order)
        return {"translation": tf.gather(translations, inverse),
                "score": tf.gather(scores, inverse)}

    def make_tokenizer(self):
        """The SentencePiece tokenizer, made inside the traced graph, so the SavedModel
        needs no resource object (:func:`tfxformer.data.tokenizer.sentencepiece_tokenizer`
        holds the one fix for tensorflow-text's kernel-owned resource)."""
        return sentencepiece_tokenizer(self.sentencepiece_model)

    def tokenize(self, text, tokenizer=None):
        """(N,) strings -> (N, None) ragged int32 source ids: pieces, cut, then EOS."""
        tokenizer = tokenizer or self.make_tokenizer()
        text = sanitize_utf8(text)
        text = tf.strings.substr(text, 0, self.max_input_length * CHARS_PER_TOKEN,
                                 unit="UTF8_CHAR")
        pieces = tokenizer.tokenize(text)[:, : self.max_input_length - 1]
        eos = tf.fill([tf.shape(text)[0], 1], EOS_ID)
        return tf.concat([pieces, tf.RaggedTensor.from_tensor(eos)], axis=1)

    def detokenize(self, ids, lengths, tokenizer=None):
        """(B, L) ids with (B,) lengths counting a final EOS -> (B,) UTF-8 strings."""
        tokenizer = tokenizer or self.make_tokenizer()
        last = tf.gather(ids, tf.maximum(lengths - 1, 0), batch_dims=1)
        lengths = lengths - tf.cast((lengths > 0) & tf.equal(last, EOS_ID), lengths.dtype)
        text = tokenizer.detokenize(tf.RaggedTensor.from_tensor(ids, lengths=lengths))
        return sanitize_utf8(text)

    def _translate_sorted(self, pieces, options, tokenizer):
        """Translates chunks of `max_batch_size` rows of `pieces` in a tf.while_loop."""
        total = pieces.nrows(out_type=tf.int32)
        size = self.max_batch_size
        chunks = (total + size - 1) // size

        def body(c, translations, scores):
            rows = pieces[c * size:tf.minimum((c + 1) * size, total)]
            out = beam_search(self.model, rows.to_tensor(), **options)
            text = self.detokenize(out.ids[:, 0], out.lengths[:, 0], tokenizer)
            return c + 1, translations.write(c, text), scores.write(c, out.scores[:, 0])

        arrays = [tf.TensorArray(dtype, size=chunks, infer_shape=False, element_shape=[None])
                  for dtype in (tf.string, tf.float32)]
        _, translations, scores = tf.while_loop(
            lambda c, *_: c < chunks, body, [tf.constant(0), *arrays])
        empty = tf.equal(total, 0)  # concat() of zero elements cannot infer a shape
        return (tf.cond(empty, lambda: tf.zeros([0], tf.string), translations.concat),
                tf.cond(empty, lambda: tf.zeros([0], tf.float32), scores.concat))
