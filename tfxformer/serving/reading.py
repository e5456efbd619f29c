"""How a translator reads N input texts as S sentence rows, and writes the rows' outputs
back onto the texts, in the graph.

A model trained on one normally cased sentence a line drops sentences of a paragraph and
writes garbage for ALL CAPS. So every signature that takes text reads it like this
(:func:`read_texts`), unless the export turned a step off (:class:`ReadingOptions`):

1. hygiene: invalid UTF-8 replaced by U+FFFD, and C0 control characters other than TAB, LF
   and CR (U+0000-U+0008, U+000B-U+000C, U+000E-U+001F) replaced by a space;
2. `sentence_split`: each text cut into its sentences by
   :func:`tfxformer.serving.segment.split` with the source language's rules (generic
   rules for a language it has none for), the whitespace and newlines between them kept;
3. `recase`: each sentence classified (:func:`tfxformer.serving.casing.classify`); an
   ALL CAPS or Title Case one is given to the model in normal case.

All the sentences of a batch are decoded together, as rows of their own. :class:`Rows`
maps each row to its text and back: a text's translation is its sentences' translations
cast back into their case and joined with the text's own separators
(:meth:`Rows.join`); a score is the sum of its sentences' (:meth:`Rows.sum`). With
`sentence_split` off each text is one row and the mapping is the identity.

Hygiene of the outputs (:meth:`Rows.clean`): a decoded row never holds a C0 control
character, nor SentencePiece's unknown piece "⁇" unless its source sentence had an
unknown piece (or "⁇" itself).

A further reading of the input (markup taken out and put back, say) belongs here: what
undoing it needs is kept in :class:`Rows`, and it is undone in :meth:`Rows.join`.

Shapes: N texts, S rows (sentences), K hypotheses, T piece columns.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import tensorflow as tf

from tfxformer.serving import casing, flat_rows, segment

__all__ = ["CONTROLS", "RAW", "UNKNOWN", "ReadingOptions", "Rows", "nbest_read", "read_texts",
           "strip_controls", "translate_read"]

# C0 controls a reading replaces by a space (TAB, LF and CR are whitespace it keeps).
CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f]"
# How SentencePiece writes its unknown piece (U+2047), with the space around it.
UNKNOWN = "\u2047"
_OUTPUT_CONTROLS = r"[\x00-\x1f]"


@dataclasses.dataclass(frozen=True)
class ReadingOptions:
    """Which steps of the reading (module docstring) an export takes; recorded in its
    config.json (`export.input`).

    Args:
        sentence_split: cut each text into sentences, decode them, join them back.
        recase: give ALL CAPS and Title Case sentences to the model in normal case and
            cast their translations back.
        markup: take inline markup out of a text before reading it and put it back into
            its translation (:mod:`tfxformer.serving.markup`); False reads it as text.
        language: the source language, for the sentence rules
            (:func:`tfxformer.serving.segment.rules`); None, or one without rules: the
            generic rules (no abbreviations).
    """

    sentence_split: bool = True
    recase: bool = True
    language: str | None = None
    markup: bool = True

    def split_rules(self) -> dict:
        """:func:`tfxformer.serving.segment.split`'s keyword arguments for `language`."""
        if self.language in segment.ABBREVIATIONS:
            return segment.rules(self.language)
        return {}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


RAW = ReadingOptions(sentence_split=False, recase=False, markup=False)


def strip_controls(text):
    """(N,) strings with each C0 control other than TAB, LF, CR replaced by a space."""
    return tf.strings.regex_replace(text, CONTROLS, " ")


class Rows(NamedTuple):
    """N texts read as S rows (:func:`read_texts`): `text_of` (S,) int32 each row's text
    (rows of a text are consecutive, in order); `separators` (N, None) strings, one more
    per text than its rows (None: each text is one row); `kinds` (S,) int32 each row's
    casing kind (None: not recased); `texts` () int32 N."""

    text_of: tf.Tensor
    separators: tf.RaggedTensor | None
    kinds: tf.Tensor | None
    texts: tf.Tensor

    @property
    def split(self) -> bool:
        return self.separators is not None

    def per_row(self, values):
        """(N, ...) one value per text -> (S, ...) each row its text's."""
        return tf.gather(values, self.text_of) if self.split else values

    def first(self):
        """(S,) bool: the row is its text's first."""
        previous = tf.concat([[-1], self.text_of[:-1]], axis=0)
        return tf.not_equal(self.text_of, previous)

    def counts(self):
        """(N,) int32 each text's rows."""
        return tf.math.unsorted_segment_sum(tf.ones_like(self.text_of), self.text_of,
                                            self.texts)

    def has_rows(self):
        """(N,) bool: the text has a row (a text of only whitespace has none)."""
        return self.counts() > 0

    def clean(self, strings, unknown_ok):
        """Row outputs (S, ...) strings without C0 controls and, where `unknown_ok` (S,)
        bool is False, without the unknown piece "⁇" (and one space beside it)."""
        strings = tf.strings.regex_replace(strings, _OUTPUT_CONTROLS, "")
        allowed = tf.reshape(unknown_ok, tf.concat([tf.shape(unknown_ok),
                                                    tf.ones_like(tf.shape(strings)[1:])], 0))
        without = tf.strings.regex_replace(tf.strings.regex_replace(
            strings, f" ?{UNKNOWN} ?", " "), "^ | $", "")
        has = tf.strings.regex_full_match(strings, f"(?s).*{UNKNOWN}.*")
        return tf.where(has & ~allowed, without, strings)

    def join(self, strings, fill=""):
        """Row outputs (S,) or (S, K) strings (cleaned) -> (N,) or (N, K): each row cast
        back into its source's case, then a text's rows joined with its separators; a
        text without rows gets `fill`."""
        if self.kinds is not None:
            kinds = tf.broadcast_to(tf.reshape(self.kinds, tf.concat(
                [[-1], tf.ones_like(tf.shape(strings)[1:])], 0)), tf.shape(strings))
            strings = tf.reshape(casing.to_source_case(tf.reshape(strings, [-1]),
                                                       tf.reshape(kinds, [-1])),
                                 tf.shape(strings))
        if not self.split:
            return strings
        matrix = tf.reshape(strings, [tf.shape(strings)[0], -1])  # (S, K)
        k = tf.shape(matrix)[1]
        # (K·N) texts, column-major: text n of column j is row j·N + n
        index = (tf.range(k)[:, None] * self.texts + self.text_of[None, :])  # (K, S)
        sentences = tf.RaggedTensor.from_value_rowids(
            tf.reshape(tf.transpose(matrix), [-1]), tf.reshape(index, [-1]),
            nrows=k * self.texts, validate=False)
        separators = tf.gather(self.separators, tf.tile(tf.range(self.texts), [k]))
        texts = tf.transpose(tf.reshape(segment.join(sentences, separators), [k, -1]))
        texts = tf.where(self.has_rows()[:, None], texts, fill)
        return tf.reshape(texts, tf.concat([[self.texts], tf.shape(strings)[1:]], 0))

    def sum(self, values, fill):
        """(S, ...) row values -> (N, ...) each text's sum; a text without rows `fill`."""
        if not self.split:
            return values
        sums = tf.math.unsorted_segment_sum(values, self.text_of, self.texts)
        fill = tf.broadcast_to(tf.cast(fill, values.dtype), tf.shape(sums))
        has = tf.reshape(self.has_rows(), tf.concat([[-1], tf.ones_like(
            tf.shape(sums)[1:])], 0))
        return tf.where(has, sums, fill)

    def any(self, flags):
        """(S,) bool -> (N,) bool: a row of the text has it."""
        if not self.split:
            return flags
        return self.sum(tf.cast(flags, tf.int32), 0) > 0

    def notes(self, strings, fill):
        """(S,) row notes (warnings, "" for none) -> (N,) each text's rows' notes joined
        with "; " in row order; a text without rows `fill` (a scalar, or (N,))."""
        if not self.split:
            return strings
        keep = tf.where(tf.not_equal(strings, ""))[:, 0]
        joined = flat_rows.join_rows(tf.gather(strings, keep), tf.gather(self.text_of, keep),
                                     self.texts, separator="; ")
        return tf.where(self.has_rows(), joined, fill)

    def concat(self, values, lengths):
        """Per-row pieces (S, K, T) with (S, K) lengths -> (N, K, T') each text's rows'
        pieces one after another (T' the longest), zeros after them."""
        if not self.split:
            return values
        k = tf.shape(values)[1]
        by_column = tf.transpose(values, [1, 0, 2])  # (K, S, T)
        used = tf.reshape(tf.transpose(lengths), [-1])  # (K·S,)
        ragged = tf.RaggedTensor.from_tensor(
            tf.reshape(by_column, [-1, tf.shape(values)[2]]), lengths=used)  # (K·S, None)
        text = tf.reshape(tf.range(k)[:, None] * self.texts + self.text_of[None, :], [-1])
        per_text = tf.math.unsorted_segment_sum(used, text, k * self.texts)
        flat = tf.RaggedTensor.from_row_lengths(ragged.flat_values, per_text, validate=False)
        dense = tf.reshape(flat.to_tensor(), [k, self.texts, -1])
        return tf.transpose(dense, [1, 0, 2])


def read_texts(text, options: ReadingOptions):
    """(N,) strings -> ((S,) the rows to decode, their :class:`Rows`), per `options`
    (module docstring)."""
    text = tf.convert_to_tensor(text, tf.string)
    text = strip_controls(tf.strings.unicode_transcode(
        text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD))
    size = tf.size(text)
    if options.sentence_split:
        parts = segment.split(text, **options.split_rules())
        rows = parts.sentences.flat_values
        text_of = flat_rows.row_ids(tf.cast(parts.sentences.row_splits, tf.int32))
        separators = parts.separators
    else:
        rows, text_of, separators = text, tf.range(size), None
    kinds = None
    if options.recase:
        kinds = casing.classify(rows)
        rows = casing.to_model_case(rows, kinds)
    return rows, Rows(text_of, separators, kinds, size)


def _read_lines(lines, options: ReadingOptions):
    """(each row's source as str, the :class:`Rows`) of `lines` (str or UTF-8 bytes)."""
    texts = [line if isinstance(line, bytes) else line.encode("utf-8") for line in lines]
    rows, mapping = read_texts(tf.constant(texts, tf.string, shape=[len(texts)]), options)
    return [row.decode("utf-8") for row in rows.numpy()], mapping


def _write_lines(mapping, outputs, shape, sources, unknown):
    """The rows' `outputs` (lists of str, `shape` (S,) or (S, K)) cleaned, cast back into
    their sources' case and joined into the lines' (N,) or (N, K) numpy byte strings."""
    unknown_ok = [UNKNOWN in row or bool(unknown and unknown(row)) for row in sources]
    return mapping.join(mapping.clean(tf.constant(outputs, tf.string, shape=shape),
                                      tf.constant(unknown_ok, tf.bool, shape=shape[:1]))).numpy()


def translate_read(lines, translate, options: ReadingOptions, unknown=None) -> list[str]:
    """`lines` (str or UTF-8 bytes) translated by a Python `translate(rows: list[str]) ->
    list[str]` (a translator that is no export's graph, e.g. CTranslate2's), read and
    written back as an export's signatures do, by the same TensorFlow functions run
    eagerly: each line's rows (:func:`read_texts`) translated, cleaned, joined. `unknown`
    (str -> bool): a row's source holds an unknown piece (None: never; "⁇" counts)."""
    sources, mapping = _read_lines(lines, options)
    return [text.decode("utf-8")
            for text in _write_lines(mapping, translate(sources), [len(sources)], sources,
                                     unknown)]


def nbest_read(lines, prefixes, nbest, options: ReadingOptions, count, unknown=None):
    """`count`-best lists of `lines` (str or UTF-8 bytes) by a Python `nbest(rows:
    list[str], prefixes: list[str]) -> list[list[(text, score)]]` (a runtime that is no
    export's graph, e.g. CTranslate2's), read and written back as `translate_nbest` reads
    and writes a text (docs/robust_input.md): each line's rows decoded, a line's target
    prefix given to its first row; hypothesis j of a line is the j-th hypotheses of its
    rows, cleaned, cast back into their sources' case and joined with the line's own
    separators, its score their scores' sum ("" and -inf where a row has no j-th); a
    line without rows (blank) gets [("", 0.0)]. `unknown` as :func:`translate_read`'s."""
    sources, mapping = _read_lines(lines, options)
    row_prefixes = [prefixes[text] if is_first else "" for text, is_first in zip(
        mapping.text_of.numpy().tolist(), mapping.first().numpy().tolist(), strict=True)]
    found = nbest(sources, row_prefixes) if sources else []
    strings = [[h[j][0] if j < len(h) else "" for j in range(count)] for h in found]
    scores = [[h[j][1] if j < len(h) else -math.inf for j in range(count)] for h in found]
    shape = [len(sources), count]
    joined = _write_lines(mapping, strings, shape, sources, unknown)
    summed = mapping.sum(tf.constant(scores, tf.float64, shape=shape), 0.0)
    return [[(text.decode("utf-8"), float(score)) for text, score in zip(
                 line_texts, line_scores, strict=True)] if has else [("", 0.0)]
            for line_texts, line_scores, has in zip(joined, summed.numpy(),
                                                     mapping.has_rows().numpy(), strict=True)]
