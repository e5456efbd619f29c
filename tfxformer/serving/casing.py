"""Case robustness as TensorFlow graph ops: ALL CAPS and Title Case input.

A model trained on normally cased sentences turns ``TWO DOGS ARE PLAYING IN THE SNOW.``
into garbage: its subwords for upper-case words are rare or unseen. :func:`classify` tells
such texts apart, :func:`to_model_case` gives the model the text as it knows it
("Two dogs are playing in the snow."), and :func:`to_source_case` casts the translation
back into the source's case::

    kinds = classify(texts)                                    # (N,) int32
    out = translate(to_model_case(texts, kinds))
    out = to_source_case(out, kinds)

Kinds (int32 codes, names in :data:`KINDS`):

- ``UPPER``: no lowercase letter, and at least two words of two or more uppercase letters
  ("TWO DOGS.", "ΔΥΟ ΣΚΥΛΙΑ"); "NASA", "OK 2" and "A B C" stay ``AS_IS``.
- ``TITLE``: every space-separated word starts (after any punctuation) with a capital
  followed by lowercase letters, or is a single letter, and at least three words are
  capitalised ("Two Dogs Are Playing"). After inner punctuation either case may follow
  ("Well-known", "Man's", "T-Shirt"). A lowercase word ("Dogs in the Snow"), an inner
  capital ("iPhone") or a letter of a script without case makes the text ``AS_IS``.
- ``AS_IS``: everything else; left alone by both conversions.

A word of ``UPPER`` is a run of letters (combining marks included). Case conversions are
ICU's full Unicode mappings (tf.strings.upper/lower with encoding="utf-8"), "Ä" <-> "ä",
with one choice of ours: :func:`to_source_case` upper-cases "ß" to the capital "ẞ"
(U+1E9E, in German orthography since 2017), not ICU's "SS", so that "MAẞE" (Maße) stays
apart from "MASSE" (Masse) and lower-cases back to the word. Invalid UTF-8 never fails: a
text that is converted has it replaced by U+FFFD.
"""

import tensorflow as tf

from tfxformer.serving import flat_rows
from tfxformer.serving.segment import CLOSERS, FINAL, NEWLINE, OPENERS, SPACE, regex_pieces

__all__ = ["AS_IS", "KINDS", "TITLE", "UPPER", "classify", "to_model_case", "to_source_case"]

AS_IS, UPPER, TITLE = 0, 1, 2
KINDS = ("as_is", "upper", "title")

# Each text's letters reduced to one class digit each: 1 upper/titlecase, 2 lowercase,
# 3 caseless (CJK, Arabic, ...); a space for whitespace, "-" for anything else (digits,
# punctuation). Applied in this order.
_SHAPE = ((r"\p{M}", ""), (SPACE, " "), (r"[^\p{L} ]", "-"), (r"[\p{Lu}\p{Lt}]", "1"),
          (r"\p{Ll}", "2"), (r"\p{L}", "3"))
# On shapes: no lowercase letter, and two runs of two or more uppercase letters.
_NO_LOWER = "[-13 ]*"
_TWO_UPPER_WORDS = "(?:.*[- ])?11+[- ](?:.*[- ])?11+(?:[- ].*)?"
# On shapes: each space-separated token's first letter run capitalised or one letter; runs
# after inner punctuation ("Well-known", "Man's") capitalised or lowercase; three
# capitalised runs.
_TOKEN = "(?:-+|-*(?:12+|1|2)(?:-+(?:12*|2+))*-*)"
_TITLE_TOKENS = f" *(?:{_TOKEN}(?: +{_TOKEN})*)? *"
_TITLE_COUNT = "(?:.*12){3}.*"
# What to capitalise, matched on "\n" + text (the "\n" stands for the text's start): the
# first letter of each sentence, or of each word.
_SENTENCE_START = f"(?:{FINAL}+{CLOSERS}*{SPACE}|{NEWLINE}){SPACE}*{OPENERS}*\\p{{L}}"
_WORD_START = f"{SPACE}{OPENERS}*\\p{{L}}"


def classify(texts):
    """Each text's kind: :data:`UPPER`, :data:`TITLE` or :data:`AS_IS` ((N,) int32)."""
    shapes = tf.convert_to_tensor(texts, tf.string)
    for pattern, rewrite in _SHAPE:
        shapes = tf.strings.regex_replace(shapes, pattern, rewrite)
    upper = (tf.strings.regex_full_match(shapes, _NO_LOWER)
             & tf.strings.regex_full_match(shapes, _TWO_UPPER_WORDS))
    title = (tf.strings.regex_full_match(shapes, _TITLE_TOKENS)
             & tf.strings.regex_full_match(shapes, _TITLE_COUNT))
    return tf.where(upper, UPPER, tf.where(title, TITLE, AS_IS))


def _upper_starts(texts, start):
    """`texts` with each match of `start` (matched after a "\\n" put before each text)
    upper-cased; the rest unchanged."""
    texts = tf.convert_to_tensor(texts, tf.string)
    pieces, splits = regex_pieces("\n" + texts, start, start)
    # Only kept delimiters match in full: a piece between matches holds none.
    upper = tf.strings.regex_full_match(pieces, start)
    flat = tf.where(upper, tf.strings.upper(pieces, encoding="utf-8"), pieces)
    joined = flat_rows.join_rows(flat, flat_rows.row_ids(splits), tf.size(texts))
    length = tf.strings.length(joined)
    return tf.strings.substr(joined, tf.ones_like(length), length - 1)


def _check(texts, kinds):
    texts = tf.convert_to_tensor(texts, tf.string)
    kinds = tf.convert_to_tensor(kinds, tf.int32)
    tf.debugging.assert_equal(tf.shape(kinds), tf.shape(texts),
                              message="casing: one kind per text")
    tf.debugging.assert_less(tf.reduce_max(tf.concat([kinds, [0]], 0)), len(KINDS),
                             message="casing: kinds are AS_IS (0), UPPER (1) or TITLE (2)")
    tf.debugging.assert_non_negative(kinds, message="casing: kinds are 0, 1 or 2")
    return texts, kinds


def to_model_case(texts, kinds):
    """What to feed the model: UPPER and TITLE texts lower-cased with the first letter of
    each sentence (and of each line) capitalised; AS_IS texts unchanged.

    "TWO DOGS. A CAT!" -> "Two dogs. A cat!". Names lose their capitals ("PARIS" ->
    "paris"), which the model mostly copies or translates as it would the capitalised word.
    """
    texts, kinds = _check(texts, kinds)

    def cased():
        lowered = _upper_starts(tf.strings.lower(texts, encoding="utf-8"), _SENTENCE_START)
        return tf.where(kinds == AS_IS, texts, lowered)

    return _unless_as_is(kinds, cased, texts)


def to_source_case(translations, kinds):
    """`translations` cast into their sources' case: UPPER ones upper-cased whole ("ß" as
    "ẞ"), TITLE ones with each word's first letter capitalised (a word: what lies between
    spaces, after any opening quotes or brackets), AS_IS ones unchanged."""
    translations, kinds = _check(translations, kinds)

    def cased():
        upper = tf.strings.upper(tf.strings.regex_replace(translations, "ß", "ẞ"),
                                 encoding="utf-8")
        title = _upper_starts(translations, _WORD_START)
        return tf.where(kinds == UPPER, upper, tf.where(kinds == TITLE, title, translations))

    return _unless_as_is(kinds, cased, translations)


def _unless_as_is(kinds, cased, texts):
    """`cased()` where a text's kind is not AS_IS, else `texts` without its work (a
    `tf.cond`: a request in the model's case casts nothing)."""
    return tf.cond(tf.reduce_any(kinds != AS_IS), cased, lambda: texts)
