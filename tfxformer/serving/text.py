"""Text in and text out of a translator, in the graph: strings to source pieces, target ids
to strings.

A translator holds one :class:`TextCodec`, and every signature goes through its two entry
points: :meth:`TextCodec.to_source` reads (N,) texts into a :class:`Source` (invalid UTF-8
replaced by U+FFFD, a multilingual model's language tag put first, SentencePiece pieces
cut to a limit, then EOS; which texts were cut, which are blank), and
:meth:`TextCodec.to_text` writes the (B, L) ids of decoded rows as UTF-8 strings (a
right-to-left model's pieces put back in reading order first). The rows decoded are the
non-blank rows (:meth:`Source.decoded_rows`); :meth:`Source.restore` puts their outputs
back on all S rows. A reading of the input that the output must undo (a text split into
sentences that are joined again, a casing put back: :mod:`tfxformer.serving.reading`) keeps
what undoing it needs in the :class:`Source` (`rows`), and undoes it where the outputs go
back onto the texts (:meth:`Source.to_texts`, and :class:`tfxformer.serving.reading.Rows`'
`sum`, `any`, `notes`, `concat` for scores, flags, warnings and pieces).

Shapes: N texts, S rows (a text's sentences; one per text without sentence splitting),
B rows of one chunk, L output columns.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer import multilingual
from tfxformer.data.tokenizer import sentencepiece_tokenizer
from tfxformer.decoding.common import followed_in_row, rows_to_ragged
from tfxformer.ids import EOS_ID, PAD_ID, UNK_ID
from tfxformer.serving import flat_rows
from tfxformer.serving.inputs import per_text
from tfxformer.serving.markup import Markup, take_out
from tfxformer.serving.reading import (
    UNKNOWN,
    ReadingOptions,
    Rows,
    read_texts,
    strip_controls,
)

__all__ = ["CHARS_PER_TOKEN", "Source", "TextCodec", "sanitize_utf8", "without_eos"]

# Raw input is cut to this many characters per allowed token before tokenizing, so a
# huge string costs little: a BPE piece spans at most 16 characters (SentencePiece's
# default max_sentencepiece_length), and runs of whitespace are collapsed.
CHARS_PER_TOKEN = 64
_REPLACEMENT_CHAR = 0xFFFD  # U+FFFD, in place of invalid UTF-8


def sanitize_utf8(text):
    """(N,) strings -> valid UTF-8, invalid bytes replaced by U+FFFD (core TF op)."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=_REPLACEMENT_CHAR)


def without_eos(ids, lengths):
    """(B,) the lengths of the (B, L) `ids` rows without a final EOS."""
    last = tf.gather(ids, tf.maximum(lengths - 1, 0), batch_dims=1)
    return lengths - tf.cast((lengths > 0) & tf.equal(last, EOS_ID), lengths.dtype)


class Source(NamedTuple):
    """N texts read for decoding as S rows (:mod:`tfxformer.serving.reading`): `pieces`
    (S, None) ragged int32 (each row's pieces, cut, then EOS), `truncated` (S,) bool (a
    row was cut), `blank` (S,) bool (a row has no piece beyond its language tag: it is
    never decoded), `rows` the :class:`tfxformer.serving.reading.Rows` mapping rows to
    texts, `unknown` (S,) bool (a row's source holds an unknown piece, or "⁇"), `markup`
    the texts' inline markup, taken out before reading them
    (:mod:`tfxformer.serving.markup`), or None with markup read as text; `row_words`
    (S,) int32 the whitespace-separated words of each row read (where a text's alignments
    add up)."""

    pieces: tf.RaggedTensor
    truncated: tf.Tensor
    blank: tf.Tensor
    rows: Rows
    unknown: tf.Tensor
    markup: Markup | None = None
    row_words: tf.Tensor | None = None

    def decoded_rows(self):
        """(A,) int64 the rows that are decoded: the non-blank ones, in order."""
        return tf.where(~self.blank)[:, 0]

    def to_texts(self, strings, fill=""):
        """Row outputs (S,) or (S, K) strings -> the texts' (N,) or (N, K): cleaned
        (no control character, no "⁇" the source had not), cast back into the source's
        case and joined (:meth:`tfxformer.serving.reading.Rows.join`); a text without
        rows `fill`."""
        return self.rows.join(self.rows.clean(strings, self.unknown), fill)

    def text_truncated(self):
        """(N,) bool: a row of the text was cut."""
        return self.rows.any(self.truncated)

    def restore(self, values, fill):
        """(A, ...) outputs of the :meth:`decoded_rows` -> (S, ...) outputs of all the
        rows, a blank row's `fill` (one value, of `values`' shape after the first axis)."""
        fill = tf.convert_to_tensor(fill, values.dtype)
        values = tf.reshape(values, tf.concat([[-1], tf.shape(fill)], axis=0))  # A = 0 too
        index = tf.where(self.blank, tf.shape(values, out_type=tf.int64)[0],
                         tf.cumsum(tf.cast(~self.blank, tf.int64)) - 1)
        return tf.gather(tf.concat([values, fill[None]], axis=0), index)


class TextCodec:
    """Reads texts into source pieces and writes target ids as texts (module docstring).

    Args:
        sentencepiece_model: the bytes of `spm.model` (ids pad 0, unk 1, bos 2, eos 3),
            run in the graph (`tensorflow_text.SentencepieceTokenizer`, the bytes
            embedded).
        reverse_target: the model writes targets right to left: output pieces are put
            back in reading order, a target to score is reversed.
        target_languages: a multilingual model's target languages (() for one target):
            each text is then read with its language's tag in front.
        reading: how texts are read into rows (:class:`tfxformer.serving.reading.ReadingOptions`;
            default: sentences split with generic rules, ALL CAPS and Title Case recased).
        markup: take inline markup (tags, entities, placeholders) out of a text that has
            some before reading it, to be put back into its translation
            (:mod:`tfxformer.serving.markup`); False (or `reading.markup` False) reads
            markup as text.
    """

    def __init__(self, sentencepiece_model: bytes, reverse_target=False, target_languages=(),
                 reading=None, markup=True):
        if not isinstance(sentencepiece_model, bytes) or not sentencepiece_model:
            raise ValueError("`sentencepiece_model` must be the non-empty bytes of spm.model, "
                             f"got {type(sentencepiece_model).__name__}.")
        self.sentencepiece_model = sentencepiece_model
        self.reverse_target = bool(reverse_target)
        self.target_languages = tuple(target_languages)
        self.reading = ReadingOptions() if reading is None else reading
        self.markup = bool(markup) and self.reading.markup
        self._tags = [multilingual.tag_source(language, "") for language in
                      self.target_languages]
        self._tag_pieces = [multilingual.tag_pieces(sentencepiece_model, language)
                            for language in self.target_languages]

    def tokenizer(self):
        """The SentencePiece tokenizer, made inside the traced graph, so the SavedModel
        needs no resource object (:func:`tfxformer.data.tokenizer.sentencepiece_tokenizer`
        holds the one fix for tensorflow-text's kernel-owned resource)."""
        return sentencepiece_tokenizer(self.sentencepiece_model)

    def to_source(self, text, limits, target_language=None, tokenizer=None,
                  reading=None) -> Source:
        """(N,) strings -> their :class:`Source`: inline markup taken out (:meth:`take_out`),
        read into rows by `reading` (None: the codec's;
        :func:`tfxformer.serving.reading.read_texts`), each row cut to its text's
        `limits` (N,) int32 tokens (EOS and a language tag included); `target_language`
        ((N,) strings) is a multilingual model's, required there (:meth:`tagged`), each
        row tagged with its text's."""
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        markup = self.take_out(text)
        row_text, rows = read_texts(text if markup is None else markup.plain,
                                    reading or self.reading)
        row_words = flat_rows.word_counts(row_text)
        row_text, tag_pieces = self.tagged(row_text, target_language, rows)
        pieces, truncated, blank = self.cut(row_text, tokenizer or self.tokenizer(),
                                            rows.per_row(limits), tag_pieces)
        unknown = (tf.reduce_any(tf.equal(pieces, UNK_ID), axis=1)
                   | tf.strings.regex_full_match(row_text, f"(?s).*{UNKNOWN}.*"))
        return Source(pieces, truncated, blank, rows, unknown, markup, row_words)

    def take_out(self, text) -> Markup | None:
        """The (N,) texts' inline markup (:func:`tfxformer.serving.markup.take_out`;
        `plain` the texts to read), or None with `markup` off."""
        return take_out(sanitize_utf8(text)) if self.markup else None

    def to_text(self, ids, lengths, tokenizer=None):
        """(B, L) ids with (B,) lengths counting a final EOS -> (B,) UTF-8 strings; a
        right-to-left model's pieces (`reverse_target`) put back in reading order first."""
        tokenizer = tokenizer or self.tokenizer()
        lengths = without_eos(ids, lengths)
        if self.reverse_target:
            ids = tf.reverse_sequence(ids, lengths, seq_axis=1, batch_axis=0)
        text = tokenizer.detokenize(rows_to_ragged(ids, lengths))
        return sanitize_utf8(text)

    def tagged(self, text, target_language, rows=None):
        """(text, tag pieces): a multilingual model's (N,) texts with their language's
        tag in front and (N,) int32 the tag's pieces; fails unless there is one known
        language per text. Another model's texts as given, and None. With `rows`
        (:class:`tfxformer.serving.reading.Rows`), `text` are (S,) rows of the N texts
        `target_language` is given for, each tagged with its text's."""
        if not self.target_languages:
            if target_language is not None:
                raise ValueError("`target_language` is for a multilingual model; this one "
                                 "has one target language.")
            return text, None
        if target_language is None:
            listed = ", ".join(repr(language) for language in self.target_languages)
            raise ValueError(f"This model translates into {listed}: give `target_language`.")
        language = tf.reshape(tf.convert_to_tensor(target_language, tf.string), [-1])
        language = per_text(language, tf.size(text) if rows is None else rows.texts,
                            "target_language", tf.string)
        match = tf.equal(language[:, None], tf.constant(self.target_languages)[None, :])
        known = tf.reduce_any(match, axis=1)
        check = tf.debugging.Assert(tf.reduce_all(known), [
            f"`target_language` must be one of {', '.join(self.target_languages)}; got",
            tf.boolean_mask(language, ~known)])
        with tf.control_dependencies([check]):
            index = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int32)
        if rows is not None:
            index = rows.per_row(index)
        tags = tf.gather(tf.constant(self._tags), index)
        return (tf.strings.join([tags, text]),
                tf.gather(tf.constant(self._tag_pieces, tf.int32), index))

    def cut(self, text, tokenizer, limit, tag_pieces=None):
        """-> (pieces + EOS (N, None) ragged, truncated (N,) bool, blank (N,) bool); a
        text is blank when it has no piece beyond its `tag_pieces` ((N,) int32 or None)."""
        text = sanitize_utf8(text)
        chars = limit * CHARS_PER_TOKEN
        cut_chars = tf.strings.length(text, unit="UTF8_CHAR") > chars
        text = tf.strings.substr(text, tf.zeros_like(chars), chars, unit="UTF8_CHAR")
        pieces = tokenizer.tokenize(text)
        count = tf.cast(pieces.row_lengths(), tf.int32)
        kept = tf.minimum(count, limit - 1)
        # Each row: its first `kept` pieces, then EOS, built flat (a ragged gather and
        # concat would add some hundred ops to every signature's graph).
        starts = pieces.row_starts()
        lengths = tf.cast(kept, tf.int64) + 1
        splits, index = tf.raw_ops.RaggedRange(starts=starts, limits=starts + lengths,
                                               deltas=tf.constant(1, tf.int64))
        values = tf.concat([tf.cast(pieces.values, tf.int32), [EOS_ID]], axis=0)
        flat = tf.where(followed_in_row(lengths), tf.gather(values, index), EOS_ID)
        pieces = tf.RaggedTensor.from_row_splits(flat, splits, validate=False)
        blank = count == 0 if tag_pieces is None else count <= tag_pieces
        return pieces, cut_chars | (count > kept), blank

    def to_target(self, target, limit, tokenizer):
        """(N,) target strings to score (read as a source is: invalid UTF-8 and C0
        controls replaced) -> ((N, None) ragged int32 ids: pieces then EOS, cut to
        `limit` tokens (a cut target without its EOS); (N,) bool cut), right to left
        for a right-to-left model (its EOS still last)."""
        ids, cut, _ = self.cut(strip_controls(sanitize_utf8(target)), tokenizer,
                               tf.fill(tf.shape(target), limit + 1))
        cut |= ids.row_lengths() > limit  # the EOS itself did not fit
        if self.reverse_target:  # the pieces right to left, EOS still last
            ids = tf.concat([tf.reverse(ids[:, :-1], axis=[1]), ids[:, -1:]], axis=1)
        return ids[:, :limit], cut

    def reading_order(self, ids, values, lengths):
        """Hypotheses' ids (R, L), per-token values (R, L) and lengths (R,) -> (their ids
        (R, L), PAD after the end; their values, 0 after the end), in reading order (a
        right-to-left model's put back as :meth:`to_text` does, its EOS last)."""
        if self.reverse_target:
            text = without_eos(ids, lengths)
            ids = tf.reverse_sequence(ids, text, seq_axis=1, batch_axis=0)
            values = tf.reverse_sequence(values, text, seq_axis=1, batch_axis=0)
        real = tf.range(tf.shape(ids)[1])[None, :] < tf.cast(lengths, tf.int32)[:, None]
        return tf.where(real, tf.cast(ids, tf.int32), PAD_ID), tf.where(real, values, 0.0)

    def piece_strings(self, ids, tokenizer):
        """Ids (any shape) -> their SentencePiece pieces: EOS "</s>", PAD ""."""
        words = tf.where(tf.equal(ids, EOS_ID), "</s>", tokenizer.id_to_string(ids))
        return tf.where(tf.equal(ids, PAD_ID), "", words)
