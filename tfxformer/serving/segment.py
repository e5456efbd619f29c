"""Sentence splitting and joining as TensorFlow graph ops (strings in, strings out).

A model trained on one sentence per line drops sentences when it is handed a paragraph.
:func:`split` cuts each text into its sentences and keeps everything between them (the
exact whitespace and newlines, and the text's leading and trailing whitespace), so that
:func:`join` puts translated sentences back where the source had them::

    parts = split(texts, **rules("en"))                        # texts (N,)
    out = translate(parts.sentences.flat_values)               # all sentences, one batch
    texts_out = join(parts.sentences.with_flat_values(out), parts.separators)

``join(*split(texts))`` gives ``texts`` back byte for byte. Only core TensorFlow and
tensorflow-text ops are used (both are in TF Serving's op set), vectorized over the batch:
the texts are cut into words and the whitespace runs between them, and regular
expressions over those pieces decide which whitespace runs are sentence boundaries.

A whitespace run is a boundary when it holds a line break (``\\n``, ``\\r``, U+2028, ...),
or when the word before it ends a sentence and the word after it starts one:

- ends: the word ends with . ! ? … (or a run of them: "?!", "...") and then any closing
  quotes or brackets (``" ' ” ’ » ) ] }``), and is not a known abbreviation ("Mr.",
  "z.B.", see :func:`rules`), not letters-and-dots only ("J.", "U.S.", "e.g."), and, with
  ``ordinals=True``, not a number with a period ("3." as in German "am 3. Mai").
- starts: the word begins with an uppercase letter, a digit, an opening quote or bracket,
  or a letter of a script without case (Chinese, Arabic, ...); never a lowercase letter.

A sentence without final punctuation is found in one case, with ``openers`` (English's
rules): a capitalised opener ("A", "The", "Two", ...) between a word of lowercase letters
and a word that begins with one, three or more words from each end of its text ("... on
the sidewalk A man sits on a bench"), which a clean sentence does not hold ("equivalent to
A levels", "on the A bus" are too near an end).

No-break spaces (U+00A0, U+202F, U+2007) are never boundaries: they stay inside a word
("Nr.\\u00a05", French "Quoi\\u00a0?"). Decimal numbers ("3.5") are one word and never split.
Invalid UTF-8 never fails: its bytes are kept as they are, and an invalid byte counts as
neither a letter nor punctuation (a word beginning with one starts no sentence).
"""

import re
from typing import NamedTuple

import tensorflow as tf
from tensorflow_text.python.ops import regex_split_ops

from tfxformer.serving import flat_rows

__all__ = ["ABBREVIATIONS", "CLOSERS", "FINAL", "NEWLINE", "OPENERS", "ORDINAL_LANGUAGES",
           "QUOTES", "SENTENCE_OPENERS", "SPACE", "STARTER", "Segments", "join", "regex_pieces",
           "rules", "split"]

# Character classes shared with :mod:`tfxformer.serving.casing` (RE2 syntax).
QUOTES = "\"'“”‘’«»„‚‹›"
OPENERS = "[" + re.escape(QUOTES + "([{¿¡") + "]"
CLOSERS = "[" + re.escape(QUOTES + ")]}") + "]"
FINAL = "[" + re.escape(".!?…‼⁇⁈⁉。！？") + "]"
# Breaking whitespace: \s is ASCII only in RE2; the no-break spaces are left out.
SPACE = r"[\t\n\x0b\f\r \x{85}\x{1680}\x{2000}-\x{2006}\x{2008}-\x{200a}\x{2028}\x{2029}" \
        r"\x{205f}\x{3000}]"
NEWLINE = r"[\n\x0b\f\r\x{85}\x{2028}\x{2029}]"
# Where a sentence may begin: uppercase or titlecase letter, digit, caseless letter.
STARTER = r"[\p{Lu}\p{Lt}\p{Nd}\p{Lo}]"

_ENDS = f"{FINAL}{CLOSERS}*$"
_STARTS = f"^(?:{OPENERS}|{STARTER})"
_INITIALS = r"(?:\p{L}\.)+"

# Abbreviations after which a period does not end a sentence (as written, final period
# left off). An entry written in lowercase also matches with its first letter capitalised.
# Words of single letters and periods ("z.B.", "e.g.", "S.", "U.S.") never end one anyway.
ABBREVIATIONS = {
    "en": ("Mr", "Mrs", "Ms", "Dr", "Prof", "St", "vs", "etc", "No", "Nos", "Inc", "Ltd",
           "Co", "Corp", "Jr", "Sr", "Mt", "Ft", "Gen", "Gov", "Sen", "Rep", "Lt", "Col",
           "Capt", "Sgt", "Rev", "Hon", "Fig", "Figs", "Vol", "Vols", "Ed", "Eds", "approx",
           "cf", "al", "ca", "Ave", "Blvd", "Rd", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul",
           "Aug", "Sep", "Sept", "Oct", "Nov", "Dec", "Ph.D"),
    "de": ("usw", "bzw", "Nr", "Dr", "Prof", "Hr", "Hrn", "Fr", "ca", "ggf", "vgl", "etc",
           "evtl", "inkl", "exkl", "bspw", "sog", "Str", "Abs", "Abb", "Bd", "St", "Mio",
           "Mrd", "Jh", "Jhd", "zzgl", "Tel", "geb", "gest", "Dipl", "Ing", "Mag", "usf",
           "etw", "Jan", "Feb", "Mär", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Okt", "Nov",
           "Dez"),
    "fr": ("MM", "Mme", "Mmes", "Mlle", "Mlles", "Dr", "Pr", "Me", "Mgr", "St", "Ste",
           "p.ex", "etc", "cf", "av", "apr", "J.-C", "env", "éd", "vol", "chap", "bd", "ex",
           "janv", "févr", "avr", "juil", "sept", "oct", "nov", "déc"),
}
# Languages where "3." before a capitalised word is an ordinal, not a sentence end.
ORDINAL_LANGUAGES = frozenset({"de"})
# Words that, capitalised after a lowercase word with no punctuation between, begin a new
# sentence (a caption or list item whose final period is missing). English only: German
# capitalises its nouns, and French's candidates ("Le", "La") begin names ("dans Le Monde").
SENTENCE_OPENERS = {
    "en": ("A", "An", "The", "This", "These", "Those", "There", "One", "Two", "Three", "Four",
           "Five", "Six", "Seven", "Eight", "Nine", "Ten", "Several", "Some", "Many", "Most",
           "Few", "All", "Each", "Every", "Both"),
}
# Words a boundary before an opener needs on each side of it, within its text.
_OPENER_CONTEXT = 3


def rules(language):
    """The splitting rules of `language` ("de", "en" or "fr") as keyword arguments of
    :func:`split`: ``split(texts, **rules("de"))``."""
    if language not in ABBREVIATIONS:
        raise ValueError(f"no sentence rules for language {language!r}; known: "
                         f"{sorted(ABBREVIATIONS)} (or call split() with your own "
                         "abbreviations)")
    return {"abbreviations": ABBREVIATIONS[language],
            "ordinals": language in ORDINAL_LANGUAGES,
            "openers": SENTENCE_OPENERS.get(language, ())}


class Segments(NamedTuple):
    """What :func:`split` returns: text i is ``separators[i][0] + sentences[i][0] +
    separators[i][1] + ... + sentences[i][k-1] + separators[i][k]``."""
    sentences: tf.RaggedTensor   # (N, None) string: the sentences of each text
    separators: tf.RaggedTensor  # (N, None) string: one more per text than its sentences


def _no_end_pattern(abbreviations, ordinals):
    """A full-match pattern for words after which a period never ends a sentence."""
    if isinstance(abbreviations, (str, bytes)):
        raise ValueError(f"abbreviations: a list of words, not the string {abbreviations!r}")
    words = set()
    for entry in abbreviations:
        entry = entry.strip()
        entry = entry[:-1] if entry.endswith(".") else entry
        if not entry:
            raise ValueError(f"empty abbreviation in {list(abbreviations)!r}")
        words.add(entry)
        if entry[0].islower():
            words.add(entry[0].upper() + entry[1:])
    kinds = [_INITIALS]
    if words:
        kinds.append("(?:" + "|".join(re.escape(w) for w in sorted(words)) + r")\.")
    if ordinals:
        kinds.append(r"\p{Nd}+\.")
    return f"{OPENERS}*(?:{'|'.join(kinds)})"


def regex_pieces(texts, delimiter, kept):
    """(N,) strings -> (P,) their pieces, split at the matches of `delimiter` (those of
    `kept` kept as pieces), and the (N + 1,) int64 row splits of each text's:
    `tensorflow_text.regex_split(texts, delimiter, kept)`'s values and row splits from its
    op (RegexSplitWithOffsets) alone, without the ~300 graph nodes with which that function
    validates its three ragged results."""
    tokens, _, _, splits = regex_split_ops.gen_regex_split_ops.regex_split_with_offsets(
        tf.reshape(tf.convert_to_tensor(texts, tf.string), [-1]), f"({delimiter})",
        f"({kept})")
    return tokens, splits


def _has(strings, pattern):
    """Whether `pattern` matches somewhere in each string (``^``/``$`` in it test an end).

    Replacing the match and comparing, rather than a full match of ``.*PATTERN``: RE2's
    ``.`` does not match invalid UTF-8, and a partial match still finds the end."""
    return tf.not_equal(tf.strings.regex_replace(strings, pattern, "", replace_global=False),
                        strings)


def _words(words, what):
    """A full-match pattern for a list of words (`what` names the argument in errors)."""
    if isinstance(words, (str, bytes)):
        raise ValueError(f"{what}: a list of words, not the string {words!r}")
    if any(not word or any(c.isspace() for c in word) for word in words):
        raise ValueError(f"{what}: words without whitespace, got {list(words)!r}")
    return "(?:" + "|".join(re.escape(word) for word in sorted(set(words))) + ")"


def _ahead(values, k):
    """values[i + k] for each i (k < 0: behind), False where that is outside `values`."""
    size = tf.size(values)
    padded = tf.pad(values, [[max(-k, 0), max(k, 0)]])
    return padded[max(k, 0):max(k, 0) + size]


def split(texts, abbreviations=(), ordinals=False, openers=()):
    """Cuts each text into its sentences, keeping what lies between them.

    Args:
        texts: (N,) string tensor (or list of str).
        abbreviations: words after which a period does not end a sentence, e.g.
            ``rules("en")["abbreviations"]``; with or without the final period.
        ordinals: a number with a period ("3.") does not end a sentence (German).
        openers: capitalised words that begin a sentence after a lowercase word without
            final punctuation, given three words or more on each side within the text
            (``rules("en")["openers"]``); none by default.

    Returns:
        :class:`Segments`: `sentences` (N, None) and `separators` (N, None) with one more
        per text than sentences. A text of only whitespace (or empty) has no sentence and
        one separator, the text itself; a text with no whitespace around its one sentence
        has the separators ``["", ""]``.
    """
    texts = tf.convert_to_tensor(texts, tf.string)
    flat, splits = regex_pieces(texts, SPACE + "+", SPACE + "+")  # words and spaces
    splits = tf.cast(splits, tf.int32)
    row = flat_rows.row_ids(splits)
    position = tf.range(tf.size(flat)) - tf.gather(splits[:-1], row)
    last = tf.gather(splits[1:] - splits[:-1], row) - 1
    is_space = tf.strings.regex_full_match(flat, SPACE + "+")
    ends = _has(flat, _ENDS) & ~tf.strings.regex_full_match(
        flat, _no_end_pattern(abbreviations, ordinals))
    starts = _has(flat, _STARTS)
    # Interior whitespace always has a word on each side, in the same text.
    prev_ends = tf.concat([[False], ends[:-1]], 0)
    next_starts = tf.concat([starts[1:], [False]], 0)
    boundary = prev_ends & next_starts
    if openers:
        # Words and whitespace alternate: the words around an interior whitespace run at
        # p are at p - 1, p - 3, ... and p + 1, p + 3, ...
        reach = 2 * _OPENER_CONTEXT - 1
        boundary |= ((position >= reach) & (position + reach <= last)
                     & _ahead(tf.strings.regex_full_match(flat, r"\p{Ll}+"), -1)
                     & _ahead(tf.strings.regex_full_match(flat, _words(openers, "openers")), 1)
                     & _ahead(_has(flat, r"^\p{Ll}"), 3))
    breaks = is_space & ((position == 0) | (position == last) | _has(flat, NEWLINE)
                         | boundary)
    prev_breaks = tf.concat([[True], breaks[:-1]], 0)
    begins = ~breaks & ((position == 0) | prev_breaks)
    started = tf.cumsum(tf.cast(begins, tf.int32))  # sentences begun up to here, all texts
    total = tf.reduce_sum(tf.cast(begins, tf.int32))
    per_text = tf.cast(tf.math.unsorted_segment_sum(tf.cast(begins, tf.int32), row,
                                                    tf.size(texts)), tf.int64)
    inside = ~breaks  # words and the whitespace within sentences
    sentences = flat_rows.join_rows(flat_rows.masked(flat, inside),
                                    flat_rows.masked(started, inside) - 1, total)
    # Text i's separators are slots (sentences of texts before i) + i ... + per_text[i].
    separators = flat_rows.join_rows(flat_rows.masked(flat, breaks),
                                     flat_rows.masked(started + row, breaks),
                                     total + tf.size(texts))
    return Segments(tf.RaggedTensor.from_row_lengths(sentences, per_text, validate=False),
                    tf.RaggedTensor.from_row_lengths(separators, per_text + 1, validate=False))


def join(sentences, separators):
    """The texts rebuilt from (translated) `sentences` and the source's `separators`.

    Args:
        sentences: (N, None) string RaggedTensor, e.g. ``parts.sentences.with_flat_values(
            translations)``.
        separators: (N, None) string RaggedTensor from :func:`split`, one more per text.

    Returns:
        (N,) string tensor: ``sep0 + sent0 + sep1 + ... + sent(k-1) + sepk`` per text.
    """
    tf.debugging.assert_equal(
        tf.cast(separators.row_lengths(), tf.int64),
        tf.cast(sentences.row_lengths(), tf.int64) + 1,
        message="join(): each text needs one separator more than it has sentences, as "
                "split() returns them")
    separator_rows = flat_rows.row_ids(tf.cast(separators.row_splits, tf.int32))
    sentence_rows = flat_rows.row_ids(tf.cast(sentences.row_splits, tf.int32))
    # A text's separators and sentences alternate, one separator more: in the order of all
    # the texts' items, separator f (flat) of text i is item 2f - i, sentence g item
    # 2g + i + 1.
    order = [2 * tf.range(tf.size(separator_rows)) - separator_rows,
             2 * tf.range(tf.size(sentence_rows)) + sentence_rows + 1]
    items = tf.dynamic_stitch(order, [separators.flat_values, sentences.flat_values])
    rows = tf.dynamic_stitch(order, [separator_rows, sentence_rows])
    return flat_rows.join_rows(items, rows, separators.nrows())
