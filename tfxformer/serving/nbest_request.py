"""What a `translate_nbest` request asks, read in the graph: its inputs checked, and each
text's target prefix and constraints as pieces, with a warning of what was changed.

`translate_nbest` is the signature with every option, one value per text (so TF Serving's
batching can batch it; docs/steering.md): the options of `translate_per_example` plus
`num_hypotheses`, the repetition controls, a target prefix and terminology constraints, and
it returns each text's n-best list, best first (:mod:`tfxformer.serving.nbest_lists` makes
the lists). :func:`read_request` reads one; :class:`tfxformer.serving.Translator` decodes it.

Shapes: N texts, K hypotheses per text (the batch's largest `num_hypotheses`).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfxformer.serving import flat_rows
from tfxformer.serving.inputs import checked, example_options, per_text
from tfxformer.serving.reading import strip_controls
from tfxformer.serving.text import CHARS_PER_TOKEN, sanitize_utf8

__all__ = ["NBEST_INPUTS", "NBEST_SPECS", "OFF", "PHRASE_SEPARATOR", "NBestOptions",
           "NBestRequest", "checked_options", "first_rows", "per_row", "read_request",
           "width"]

# The per-text inputs of `translate_nbest` after `text` (and a multilingual model's
# `target_language`), in order; each (N,), and the value that turns the option off.
NBEST_SPECS = (tf.TensorSpec([None], tf.int32, name="beam_size"),
               tf.TensorSpec([None], tf.float32, name="alpha"),
               tf.TensorSpec([None], tf.int32, name="extra_length"),
               tf.TensorSpec([None], tf.int32, name="max_input_tokens"),
               tf.TensorSpec([None], tf.int32, name="num_hypotheses"),
               tf.TensorSpec([None], tf.int32, name="no_repeat_ngram_size"),
               tf.TensorSpec([None], tf.float32, name="repetition_penalty"),
               tf.TensorSpec([None], tf.string, name="target_prefix"),
               tf.TensorSpec([None], tf.string, name="constraints"))
NBEST_INPUTS = tuple(spec.name for spec in NBEST_SPECS)
# The values of the inputs after `num_hypotheses` that turn their option off.
OFF = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "target_prefix": "",
       "constraints": ""}
# What separates the phrases of a text's `constraints`.
PHRASE_SEPARATOR = "\t"


class NBestRequest(NamedTuple):
    """A request's per-text values: `options` {beam_size, alpha, extra_length} (N,) each;
    `count` (N,) int32 hypotheses asked; `ngram` (N,) int32 and `penalty` (N,) float32 the
    repetition controls; `prefix` (N, None) ragged int32 prefix pieces; `phrases` (N,
    None, None) ragged int32 constraint pieces; `warning` (N,) strings."""

    options: dict
    count: tf.Tensor
    ngram: tf.Tensor
    penalty: tf.Tensor
    prefix: tf.RaggedTensor
    phrases: tf.RaggedTensor
    warning: tf.Tensor

    def rows(self, index):
        """The request of the texts `index` (a (R,) index tensor)."""
        return NBestRequest({name: tf.gather(value, index) for name, value in
                             self.options.items()},
                            *(tf.gather(value, index) for value in self[1:]))


class NBestOptions(NamedTuple):
    """A request's per-text options, checked: the first fields of :class:`NBestRequest`."""

    options: dict
    count: tf.Tensor
    ngram: tf.Tensor
    penalty: tf.Tensor


def checked_options(size, beam_size, alpha, extra_length, num_hypotheses,
                    no_repeat_ngram_size, repetition_penalty) -> NBestOptions:
    """The request's options, (N,) each and checked: one value per text (or one for
    all), each in its accepted range."""
    options = example_options(dict(beam_size=beam_size, alpha=alpha,
                                   extra_length=extra_length), size)
    count = hypothesis_counts(num_hypotheses, options["beam_size"], size)
    return NBestOptions(options, count, *repetition_controls(no_repeat_ngram_size,
                                                             repetition_penalty, size))


def per_row(options: NBestOptions, rows) -> NBestOptions:
    """The (N,) per-text `options` as (S,) per-row ones: each sentence row takes its
    text's (`rows`: :class:`tfxformer.serving.reading.Rows`)."""
    return NBestOptions({name: rows.per_row(value) for name, value in options.options.items()},
                        *(rows.per_row(value) for value in options[1:]))


def first_rows(size, rows, target_prefix, constraints):
    """((S,) the rows' target prefixes, (S,) their constraints, (N,) the warnings of the
    texts without rows): a text's prefix and constraints go with its first sentence row,
    the other rows have none (docs/robust_input.md); a text of only whitespace (no row)
    has them ignored."""
    if not rows.split:
        return target_prefix, constraints, tf.fill([size], "")
    given = [per_text(value, size, name, tf.string) for name, value in (
        ("target_prefix", target_prefix), ("constraints", constraints))]
    first = rows.first()
    no_rows = ~rows.has_rows()
    warning = with_notes(tf.fill([size], ""), [
        (no_rows & tf.not_equal(value, ""), f"blank text: {name} ignored")
        for name, value in zip(("target_prefix", "constraints"), given, strict=True)])
    return (*(tf.where(first, rows.per_row(value), "") for value in given), warning)


def read_request(options: NBestOptions, target_prefix, constraints, tokenizer, limit, blank,
                 reverse_target) -> NBestRequest:
    """The :class:`NBestRequest` of N texts: their `options` with their prefixes and
    constraints read (:func:`prefixes`, :func:`constraint_phrases`; `limit` (N,) pieces
    each, `blank` (N,) bool)."""
    size = tf.size(blank)
    prefix, warning = prefixes(target_prefix, size, tokenizer, limit, blank, reverse_target)
    phrases, warning = constraint_phrases(constraints, size, tokenizer, limit, blank,
                                          reverse_target, warning)
    return NBestRequest(*options, prefix, phrases, warning)


def hypothesis_counts(num_hypotheses, beam_size, size):
    """(N,) int32 `num_hypotheses`, checked: 1 <= num_hypotheses <= beam_size per text."""
    count = per_text(num_hypotheses, size, "num_hypotheses", tf.int32)
    return checked(count, tf.reduce_all((count >= 1) & (count <= beam_size)),
                   "`num_hypotheses` must be >= 1 and <= `beam_size` for every text")


def width(count):
    """K: the largest of the (N,) counts, 1 for an empty batch."""
    return tf.reduce_max(tf.concat([count, [1]], axis=0))


def repetition_controls(no_repeat_ngram_size, repetition_penalty, size):
    """(N,) int32 and (N,) float32, checked: n-gram size >= 0, penalty > 0."""
    ngram = per_text(no_repeat_ngram_size, size, "no_repeat_ngram_size", tf.int32)
    penalty = per_text(repetition_penalty, size, "repetition_penalty", tf.float32)
    ngram = checked(ngram, tf.reduce_all(ngram >= 0),
                    "`no_repeat_ngram_size` must be >= 0 (0 = off) for every text")
    penalty = checked(penalty, tf.reduce_all(penalty > 0.0),
                      "`repetition_penalty` must be > 0 (1 = off) for every text")
    return ngram, penalty


def prefixes(target_prefix, size, tokenizer, limit, blank, reverse_target):
    """(N,) prefixes -> ((N, None) ragged pieces cut to `limit` (N,), (N,) warnings):
    invalid UTF-8 replaced; a right-to-left model's (`reverse_target`) and a blank
    text's prefix ignored."""
    given = per_text(target_prefix, size, "target_prefix", tf.string)
    text = sanitize_utf8(given)
    prefix, cut = prefix_pieces(tokenizer, strip_controls(text), limit)
    has = prefix.row_lengths() > 0
    ignored = has & (blank | reverse_target)
    lengths = prefix.row_lengths()
    prefix = tf.RaggedTensor.from_row_lengths(
        flat_rows.masked(prefix.values, flat_rows.repeat(~ignored, lengths)),
        tf.where(ignored, tf.zeros_like(lengths), lengths), validate=False)
    notes = [(cut & ~ignored, tf.strings.join(["target_prefix cut to ",
                                               tf.strings.as_string(limit),
                                               " pieces (the output limit less one)"])),
             (tf.not_equal(text, given), "invalid UTF-8 in target_prefix replaced by "
                                         "U+FFFD"),
             (has & blank, "blank text: target_prefix ignored")]
    if reverse_target:
        notes.append((has, "target_prefix ignored: the model writes right to left"))
    return prefix, with_notes(tf.fill([size], ""), notes)


def constraint_phrases(constraints, size, tokenizer, limit, blank, reverse_target, warning):
    """(N,) constraints -> ((N, None, None) ragged phrase pieces, (N,) warnings with
    what was changed added): invalid UTF-8 replaced, phrases left out beyond `limit`
    (N,) pieces, a blank text's ignored; for a right-to-left model each phrase's
    pieces right to left, as it writes them."""
    given = per_text(constraints, size, "constraints", tf.string)
    text = sanitize_utf8(given)
    phrases, cut = constraint_pieces(tokenizer, strip_controls(text), limit)
    if reverse_target:  # the model writes each phrase's pieces right to left
        phrases = reversed_phrases(phrases)
    has = phrases.row_lengths() > 0
    ignored = has & blank
    phrases = keep_items(phrases, flat_rows.repeat(~ignored, phrases.row_lengths()))
    pieces = row_sums(phrases.values.row_lengths(), phrases.row_splits)
    notes = [(cut & ~ignored, tf.strings.join([
                 "constraints cut to ", tf.strings.as_string(pieces), " pieces (the output "
                 "limit less one: ", tf.strings.as_string(limit), "): phrases left out"])),
             (tf.not_equal(text, given), "invalid UTF-8 in constraints replaced by "
                                         "U+FFFD"),
             (has & blank, "blank text: constraints ignored")]
    return phrases, with_notes(warning, notes)


def with_notes(warning, notes):
    """(N,) warnings with each (where (N,) bool, note) pair's note added where it holds."""
    for where, note in notes:
        joined = tf.strings.join([warning, tf.where(tf.equal(warning, ""), "", "; "), note])
        warning = tf.where(where, joined, warning)
    return warning


def prefix_pieces(tokenizer, prefix, limit):
    """(N,) valid UTF-8 prefixes -> (pieces (N, None) ragged int32 cut to `limit` (N,)
    pieces each, cut (N,) bool: a prefix had more)."""
    prefix = tf.strings.substr(prefix, tf.zeros_like(limit), (limit + 1) * CHARS_PER_TOKEN,
                               unit="UTF8_CHAR")
    pieces = tokenizer.tokenize(prefix)
    count = tf.cast(pieces.row_lengths(), tf.int32)
    kept = tf.minimum(count, tf.maximum(limit, 0))
    starts = tf.cast(pieces.row_starts(), tf.int32)
    kept_pieces = tf.gather(tf.cast(pieces.values, tf.int32), tf.ragged.range(starts,
                                                                               starts + kept))
    return kept_pieces, count > kept


def constraint_pieces(tokenizer, constraints, limit):
    """(N,) valid UTF-8 constraints (phrases separated by TAB) -> (phrases (N, None, None)
    ragged int32 pieces, empty phrases left out and the last phrases left out where a
    text's pieces would exceed `limit` (N,), cut (N,) bool: phrases were left out)."""
    text = tf.strings.substr(constraints, tf.zeros_like(limit),
                             (limit + 1) * CHARS_PER_TOKEN, unit="UTF8_CHAR")
    phrases = tf.strings.split(text, sep=PHRASE_SEPARATOR)  # (N, None) strings
    pieces = tokenizer.tokenize(phrases.flat_values)  # (N·P, None)
    pieces = tf.RaggedTensor.from_row_splits(tf.cast(pieces, tf.int32), phrases.row_splits,
                                             validate=False)
    # Flat over the N·P phrases (a ragged reduce or boolean mask adds scores of ops).
    sizes = tf.cast(pieces.values.row_lengths(), tf.int32)  # pieces per phrase
    splits = phrases.row_splits
    text_of = flat_rows.row_ids(splits)  # (N·P,) each phrase's text
    ends = tf.cumsum(sizes)
    before = tf.gather(tf.concat([[0], ends], axis=0), splits[:-1])  # (N,) earlier texts'
    running = ends - tf.gather(before, text_of)  # pieces of the text's phrases so far
    fits = (running <= tf.gather(tf.maximum(limit, 0), text_of)) & (sizes > 0)
    kept_sizes = tf.where(fits, sizes, 0)
    return keep_items(pieces, fits), row_sums(sizes, splits) > row_sums(kept_sizes, splits)


def row_sums(values, splits):
    """(N,) the sums of flat `values` over the N rows of `splits` (N + 1,): a running sum
    read at the splits (a ragged `reduce_sum`'s result in fewer ops)."""
    running = flat_rows.splits_of(values)
    return tf.gather(running, splits[1:]) - tf.gather(running, splits[:-1])


def keep_items(ragged, keep):
    """A (N, None, ...) ragged tensor with only the items (rows of `ragged.values`) where
    `keep` (flat bool) is True, in order (`tf.ragged.boolean_mask`'s result, in fewer ops)."""
    splits = ragged.row_splits
    kept = flat_rows.splits_of(tf.cast(keep, splits.dtype))  # items kept up to each
    return tf.RaggedTensor.from_row_splits(flat_rows.masked(ragged.values, keep),
                                           tf.gather(kept, splits), validate=False)


def reversed_phrases(phrases):
    """(N, None, None) ragged phrases with each phrase's pieces in reverse order."""
    inner = phrases.values
    lengths, starts = inner.row_lengths(), inner.row_starts()
    index = flat_rows.repeat(starts + lengths - 1, lengths) - tf.ragged.range(lengths).flat_values
    return phrases.with_values(inner.with_flat_values(tf.gather(inner.flat_values, index)))
