"""Inline markup kept through translation, in the graph: XML/HTML tags, entities and
placeholders taken out of a text before it is translated and put back around (or before)
the target words aligned to the source words they wrapped (docs/markup.md).

:func:`take_out` reads (N,) texts: each markup item (a tag `<b>`, `</b>`, `<br/>`,
`<a href="x">`, a comment, an entity `&amp;` `&#38;`, a placeholder `{0}` `{{name}}` `%s`,
or any `placeholders` pattern) is cut out, verbatim, and anchored to source words: a
paired tag (an opening tag and the closing tag of the same name that closes it, nested as
XML nests) to the words it wraps, any other item (a self-closing tag, an entity, a
placeholder, and an opening or closing tag without its partner: an unbalanced tag is kept
as a standalone token) to the word it precedes, or the word it follows where it is glued
to that one. The rest, whitespace collapsed, is what is translated.
:func:`put_back` writes the items back into each translation in their source order, each
at the target words its source words are aligned to (Pharaoh alignments,
:mod:`tfxformer.serving.alignment`): the items of a text come out exactly, byte for byte,
and in the same order, so a well-formed source gives a well-formed output with the same
nesting. Where the alignment would cross an earlier item, an item moves right, after it.
A text without markup is left as it is (byte for byte); so is everything with `markup`
off.

Shapes: N texts, M markup items of all the texts, P alignment pairs.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import tensorflow as tf

from tfxformer.serving import flat_rows

__all__ = ["DEFAULT_PLACEHOLDERS", "Markup", "markup_pattern", "put_back", "take_out",
           "widen"]

_COMMENT = r"<!--.*?-->"
_TAG = r"</?[A-Za-z_:][^<>]*>"
_ENTITY = r"&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);"
# {{name}}, {0} / {name}, printf's %s %d %i %f and %(name)s
DEFAULT_PLACEHOLDERS = (r"\{\{[^{}]*\}\}", r"\{[0-9A-Za-z_]*\}", r"%(?:\([A-Za-z_]+\))?[sdif]")
_CUT = "\x01"  # marks the items' edges while splitting (taken out of the text first)
OPEN, CLOSE, STANDALONE = 0, 1, 2
_BIG = 2 ** 30
_SHIFT = 2 ** 20


def markup_pattern(placeholders=DEFAULT_PLACEHOLDERS) -> str:
    """The RE2 pattern of one markup item: comments, tags, entities, then `placeholders`
    (a sequence of regular expressions; () for none).

    Raises:
        ValueError: a placeholder pattern that is no non-empty string or does not compile.
    """
    if isinstance(placeholders, str):
        raise ValueError(f"`placeholders` takes a sequence of patterns, got the string "
                         f"{placeholders!r}; e.g. [{placeholders!r}].")
    for pattern in placeholders:
        try:
            ok = isinstance(pattern, str) and pattern and re.compile(pattern)
        except re.error:
            ok = False
        if not ok:
            raise ValueError(f"A placeholder pattern must be a non-empty regular expression, "
                             f"got {pattern!r}.")
    return "(" + "|".join([_COMMENT, _TAG, _ENTITY, *placeholders]) + ")"


class Markup(NamedTuple):
    """N texts' markup (:func:`take_out`): `plain` (N,) the texts to translate, `marked`
    (N,) bool a text had markup; per item (M,), in text order: `items` the item's bytes,
    `rows` int64 its text, `kinds` OPEN, CLOSE (a paired tag) or STANDALONE, `first` and
    `last` int32 the source words it is anchored to, `after` bool placed after them (else
    before), `glue_left` and `glue_right` bool no space on that side."""

    plain: tf.Tensor
    marked: tf.Tensor
    items: tf.Tensor
    rows: tf.Tensor
    kinds: tf.Tensor
    first: tf.Tensor
    last: tf.Tensor
    after: tf.Tensor
    glue_left: tf.Tensor
    glue_right: tf.Tensor


def _pair(kinds, names, rows):
    """(M,) int32 each item's partner (-1: none): a closing tag closes the open tag on top
    of its text's stack when their names match (else it stays unpaired)."""
    size = tf.size(kinds)

    def body(i, depth, stack, partner):
        depth = tf.where((i > 0) & tf.not_equal(rows[i], rows[tf.maximum(i - 1, 0)]), 0,
                         depth)
        top = stack[tf.maximum(depth - 1, 0)]
        closes = (kinds[i] == CLOSE) & (depth > 0) & tf.equal(names[top], names[i])
        partner = tf.tensor_scatter_nd_update(
            partner, [[i], [top]], tf.where(closes, [top, i], [partner[i], partner[top]]))
        opens = kinds[i] == OPEN
        stack = tf.tensor_scatter_nd_update(stack, [[depth]], tf.where(opens, [i],
                                                                        [stack[depth]]))
        depth += tf.cast(opens, tf.int32) - tf.cast(closes, tf.int32)
        return i + 1, depth, stack, partner

    _, _, _, partner = tf.while_loop(
        lambda i, *_: i < size, body,
        [tf.constant(0), tf.constant(0), tf.zeros([size + 1], tf.int32),
         tf.fill([size], -1)])
    return partner


def _is_space(text, offset):
    """(M,) bool: the byte of `text` at `offset` is whitespace (False outside it)."""
    inside = (offset >= 0) & (offset < tf.strings.length(text))
    byte = tf.strings.substr(text, tf.maximum(offset, 0), tf.ones_like(offset))
    return inside & tf.strings.regex_full_match(byte, r"\s")


def take_out(text, placeholders=DEFAULT_PLACEHOLDERS) -> Markup:
    """(N,) valid UTF-8 texts -> their :class:`Markup` (module docstring). A request
    without markup takes none of the work (a `tf.cond`): its texts as given, no item."""
    text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
    pattern = markup_pattern(placeholders)
    marked = tf.strings.regex_full_match(text, f"(?s).*{pattern}.*")
    none = tf.zeros([0], tf.int32)
    return tf.cond(tf.reduce_any(marked), lambda: _items(text, marked, pattern), lambda: Markup(
        text, marked, tf.zeros([0], tf.string), tf.zeros([0], tf.int64), none, none, none,
        tf.zeros([0], tf.bool), tf.zeros([0], tf.bool), tf.zeros([0], tf.bool)))


def _items(text, marked, pattern) -> Markup:
    """:func:`take_out` of texts of which some are `marked`."""
    clean = tf.where(marked, tf.strings.regex_replace(text, _CUT, " "), "")
    segments = tf.strings.split(tf.strings.regex_replace(clean, pattern, f"{_CUT}\\1{_CUT}"),
                                sep=_CUT)
    row_starts = segments.row_splits[:-1]
    seg_rows = flat_rows.row_ids(segments.row_splits)
    local = tf.range(tf.size(segments.values, tf.int64)) - tf.gather(row_starts, seg_rows)
    odd = tf.equal(local % 2, 1)
    plain = flat_rows.join_rows(tf.where(odd, "", segments.values), seg_rows, tf.size(text))
    # each item's byte offset in `plain`: the text segments before it in its row
    before = tf.cumsum(tf.where(odd, 0, tf.strings.length(segments.values)), exclusive=True)
    row_base = tf.gather(tf.concat([before, [0]], 0), row_starts)
    index = tf.where(odd)[:, 0]
    items, rows = tf.gather(segments.values, index), tf.gather(seg_rows, index)
    offset = tf.gather(before, index) - tf.gather(row_base, rows)
    row_plain = tf.gather(plain, rows)
    prefix = tf.strings.substr(row_plain, tf.zeros_like(offset), offset)
    words_before = flat_rows.word_counts(prefix)
    words = tf.gather(flat_rows.word_counts(plain), rows)
    glue_left = (offset > 0) & ~_is_space(row_plain, offset - 1)
    glue_right = (offset < tf.strings.length(row_plain)) & ~_is_space(row_plain, offset)
    tag = tf.strings.regex_full_match(items, r"(?s)<[A-Za-z_:/].*") & \
        ~tf.strings.regex_full_match(items, r"(?s).*/>")
    raw = tf.where(tag, tf.where(tf.strings.regex_full_match(items, "(?s)</.*"), CLOSE, OPEN),
                   STANDALONE)
    names = tf.strings.regex_replace(items, r"(?s)^</?([^\s/>]*).*$", r"\1")
    partner = _pair(raw, names, rows)
    kinds = tf.where(partner >= 0, raw, STANDALONE)
    # the word an item precedes (inside a word: that word), or follows where glued to it
    ahead = words_before - tf.cast(glue_left & glue_right, tf.int32)
    behind = words_before - 1
    anchor = tf.where(kinds == CLOSE, behind, tf.where(
        (kinds == STANDALONE) & glue_left, behind, ahead))
    after = (kinds == CLOSE) | ((kinds == STANDALONE) & glue_left)
    after = tf.where(anchor >= words, True, tf.where(anchor < 0, False, after))
    anchor = tf.clip_by_value(anchor, 0, tf.maximum(words - 1, 0))
    other = tf.gather(anchor, tf.maximum(partner, 0))
    first = tf.where(kinds == CLOSE, other, anchor)
    last = tf.where(kinds == OPEN, other, anchor)
    plain = tf.strings.strip(tf.strings.regex_replace(plain, r"\s+", " "))
    return Markup(tf.where(marked, plain, text), marked, items, rows, kinds, first, last,
                  after, glue_left & (kinds != OPEN) | (kinds == CLOSE),
                  glue_right & (kinds != CLOSE) | (kinds == OPEN))


def _pairs(alignments):
    """(N,) Pharaoh strings -> (i, j) (N, None) ragged int32 each."""
    pairs = tf.strings.split(alignments)
    i = tf.strings.to_number(tf.strings.regex_replace(pairs.values, "-.*", ""), tf.int32)
    j = tf.strings.to_number(tf.strings.regex_replace(pairs.values, ".*-", ""), tf.int32)
    return pairs.with_values(i), pairs.with_values(j)


def _gaps(markup, alignments, target_words):
    """(M,) int32 the target gap of each item (g: before target word g), in text order
    never left of an earlier item's."""
    i, j = _pairs(alignments)
    i, j = tf.gather(i, markup.rows), tf.gather(j, markup.rows)  # each item's row's pairs
    item = flat_rows.row_ids(i.row_splits)
    m = tf.size(markup.rows)
    first, last = tf.gather(markup.first, item), tf.gather(markup.last, item)
    i, j = i.values, j.values

    def lowest(mask, values):
        return tf.math.unsorted_segment_min(tf.where(mask, values, _BIG), item, m)

    def highest(mask, values):
        return tf.math.unsorted_segment_max(tf.where(mask, values, -1), item, m)

    inside = (i >= first) & (i <= last)
    start, end = lowest(inside, j), highest(inside, j) + 1
    nxt = lowest(i > last, i)  # the next aligned source word, and the previous one
    nxt_start = lowest(tf.equal(i, tf.gather(nxt, item)), j)
    prev = highest(i < first, i)
    prev_end = highest(tf.equal(i, tf.gather(prev, item)), j) + 1
    count = tf.cast(tf.gather(target_words, markup.rows), tf.int32)
    outside = tf.where(markup.after, tf.where(prev >= 0, prev_end, tf.where(
        nxt < _BIG, nxt_start, count)), tf.where(nxt < _BIG, nxt_start, tf.where(
            prev >= 0, prev_end, count)))
    gap = tf.where(end > 0, tf.where(markup.after, end, start), outside)
    # never left of an earlier item of the text: the items keep their order
    dense = tf.RaggedTensor.from_value_rowids(gap, markup.rows, tf.size(target_words,
                                                                        tf.int64),
                                              validate=False)
    table = dense.to_tensor(-1)
    width = tf.shape(table)[1]
    earlier = tf.range(width)[None, :] <= tf.range(width)[:, None]  # (item, earlier item)
    kept = tf.reduce_max(tf.where(earlier[None], table[:, None, :], -1), axis=2)
    return tf.RaggedTensor.from_tensor(kept, lengths=dense.row_lengths()).values


def widen(markup: Markup, k) -> Markup:
    """The markup of N texts as that of N * k: each text's `k` times in a row (its k
    hypotheses)."""
    m = tf.size(markup.rows, tf.int64)
    k = tf.cast(k, tf.int64)
    item = flat_rows.repeat_each(tf.range(m), k)
    rows = tf.gather(markup.rows, item) * k + tf.tile(tf.range(k), [m])
    order = tf.gather(item, tf.argsort(rows * (m + 1) + item))
    rows = tf.sort(rows)
    per_text = [flat_rows.repeat_each(value, k) for value in markup[:2]]
    return Markup(*per_text, tf.gather(markup.items, order), rows,
                  *(tf.gather(value, order) for value in markup[4:10]))


def put_back(markup: Markup, translations, alignments):
    """(N,) or (N, K) translations of `markup.plain` with their Pharaoh `alignments` (of
    the same shape) -> the translations with the items put back (module docstring); a
    text without markup's as given."""
    if translations.shape.rank == 2:
        shape = tf.shape(translations)
        flat = put_back(widen(markup, shape[1]), tf.reshape(translations, [-1]),
                        tf.reshape(alignments, [-1]))
        return tf.reshape(flat, shape)
    words = tf.strings.split(translations)
    n = tf.size(translations, tf.int64)
    gaps = tf.cast(_gaps(markup, alignments, words.row_lengths()), tf.int64)
    word_rows = flat_rows.row_ids(words.row_splits)
    word_pos = tf.range(tf.size(words.values, tf.int64)) - tf.gather(words.row_splits[:-1],
                                                                     word_rows)
    item_pos = tf.range(tf.size(markup.rows, tf.int64))
    key = tf.concat([(word_rows * _SHIFT + 2 * word_pos + 1) * _SHIFT,
                     (markup.rows * _SHIFT + 2 * gaps) * _SHIFT + item_pos], axis=0)
    order = tf.argsort(key, stable=True)
    pieces = tf.gather(tf.concat([words.values, markup.items], 0), order)
    rows = tf.gather(tf.concat([word_rows, markup.rows], 0), order)
    falses = tf.zeros_like(word_rows, tf.bool)
    left = tf.gather(tf.concat([falses, markup.glue_left], 0), order)
    right = tf.gather(tf.concat([falses, markup.glue_right], 0), order)
    starts_row = tf.concat([[True], tf.not_equal(rows[1:], rows[:-1])], 0)[:tf.size(rows)]
    glued = starts_row | left | tf.concat([[True], right[:-1]], 0)[:tf.size(rows)]
    spaced = tf.strings.join([tf.where(glued, "", " "), pieces])
    rebuilt = flat_rows.join_rows(spaced, rows, n)
    return tf.where(markup.marked, rebuilt, translations)
