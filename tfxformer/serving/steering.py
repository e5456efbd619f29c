"""Graph pieces of the `translate_nbest` signature: output a translator can steer.

`translate_nbest` is the signature with every option, one value per text (so TF Serving's
batching can batch it; docs/steering.md): the options of `translate_per_example` plus
`num_hypotheses`, the repetition controls, a target prefix and terminology constraints, and
it returns each text's n-best list, best first. With a prefix the list holds the
alternatives at the first position after it, each continued by its own search
(CTranslate2's `return_alternatives`). This module holds its graph helpers;
:class:`tfxformer.serving.Translator` calls them.

Shapes: N texts, M texts of one group, B texts of one chunk, K hypotheses per text (the
batch's largest `num_hypotheses`), L output columns.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.decoding.common import NEG_INF, rows_to_ragged
from tfxformer.decoding.steering import Steering, flatten_constraints
from tfxformer.ids import PAD_ID

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
# Characters of a prefix kept per allowed piece before tokenizing (as a source's).
_CHARS_PER_PIECE = 64


def checked(tensor, condition, message):
    """`tensor`, computed only after the scalar bool `condition` held (InvalidArgument)."""
    with tf.control_dependencies([tf.debugging.Assert(condition, [message])]):
        return tf.identity(tensor)


def per_text(value, size, name, dtype):
    """`value` as an (N,) `dtype` tensor with one value per text, or InvalidArgument."""
    value = tf.cast(value, dtype)
    if value.shape.rank != 0:
        value = checked(value, tf.equal(tf.size(value), size),
                        f"`{name}` must have one value per text (shape [N] like `text`)")
    return tf.broadcast_to(value, [size])


def hypothesis_counts(num_hypotheses, beam_size, size):
    """(N,) int32 `num_hypotheses`, checked: 1 <= num_hypotheses <= beam_size per text."""
    count = per_text(num_hypotheses, size, "num_hypotheses", tf.int32)
    return checked(count, tf.reduce_all((count >= 1) & (count <= beam_size)),
                   "`num_hypotheses` must be >= 1 and <= `beam_size` for every text")


def width(count):
    """K: the largest of the (N,) counts, 1 for an empty batch."""
    return tf.reduce_max(tf.concat([count, [1]], axis=0))


def nbest_lists(ids, lengths, scores, count, k, detokenize, token_log_probs=None,
                pieces=None):
    """A chunk's n-best lists from a beam search: ids (B, beam, L), lengths and scores
    (B, beam), count (B,) the hypotheses each text asked for -> (translations (B, K)
    strings, scores (B, K) float32), "" and -inf beyond a text's count or where the
    search holds no hypothesis (K wider than the beam, or fewer hypotheses found).

    With the search's `token_log_probs` (B, beam, L) and `pieces` (a function of them
    and ids, lengths (R, L), (R, L), (R,) -> (pieces (R, L) (ids, or strings), 0 or ""
    after the end, log-probabilities (R, L))) it also returns (B, K, L) pieces and
    log-probabilities, 0 / "" and 0 where the list holds no hypothesis."""
    batch, beam = tf.shape(ids)[0], tf.shape(ids)[1]
    kept = tf.minimum(beam, k)
    ids, lengths, scores = ids[:, :kept], lengths[:, :kept], scores[:, :kept]
    columns = tf.shape(ids)[2]
    flat_ids, flat_lengths = tf.reshape(ids, [-1, columns]), tf.reshape(lengths, [-1])
    text = tf.reshape(detokenize(flat_ids, flat_lengths), [batch, kept])
    pad = [[0, 0], [0, k - kept]]
    text, scores = tf.pad(text, pad), tf.pad(scores, pad, constant_values=NEG_INF)
    real = (tf.range(k)[None, :] < count[:, None]) & (scores > NEG_INF / 2)
    lists = (tf.where(real, text, ""),
             tf.where(real, scores, tf.constant(-float("inf"), tf.float32)))
    if token_log_probs is None:
        return lists
    words, values = pieces(flat_ids, tf.reshape(token_log_probs[:, :kept], [-1, columns]),
                           flat_lengths)
    pad3 = [[0, 0], [0, k - kept], [0, 0]]
    words = tf.pad(tf.reshape(words, [batch, kept, columns]), pad3)
    values = tf.pad(tf.reshape(values, [batch, kept, columns]), pad3)
    return (*lists, tf.where(real[..., None], words, tf.zeros_like(words)),
            tf.where(real[..., None], values, 0.0))


def with_blank_rows(blank, translations, scores, k, *per_token):
    """(A, K) n-best lists of the A non-blank texts -> (N, K) for all N texts: a blank
    text's list is the empty translation with score 0, then "" / -inf. Each of
    `per_token` ((A, K, T) pieces or log-probabilities) gets 0 / "" rows for them."""
    index = tf.where(blank, tf.shape(translations, out_type=tf.int64)[0],
                     tf.cumsum(tf.cast(~blank, tf.int64)) - 1)
    first = tf.range(k) == 0
    empty_text = tf.fill([1, k], "")
    empty_score = tf.where(first, 0.0, -float("inf"))[None, :]
    translations = tf.concat([tf.reshape(translations, [-1, k]), empty_text], axis=0)
    scores = tf.concat([tf.reshape(scores, [-1, k]), empty_score], axis=0)
    extra = []
    for values in per_token:
        columns = tf.shape(values)[2]
        values = tf.reshape(values, [-1, k, columns])
        extra.append(tf.gather(tf.concat([values, tf.zeros_like(values[:1])], axis=0), index))
    return (tf.gather(translations, index), tf.gather(scores, index), *extra)


def repetition_controls(no_repeat_ngram_size, repetition_penalty, size):
    """(N,) int32 and (N,) float32, checked: n-gram size >= 0, penalty > 0."""
    ngram = per_text(no_repeat_ngram_size, size, "no_repeat_ngram_size", tf.int32)
    penalty = per_text(repetition_penalty, size, "repetition_penalty", tf.float32)
    ngram = checked(ngram, tf.reduce_all(ngram >= 0),
                    "`no_repeat_ngram_size` must be >= 0 (0 = off) for every text")
    penalty = checked(penalty, tf.reduce_all(penalty > 0.0),
                      "`repetition_penalty` must be > 0 (1 = off) for every text")
    return ngram, penalty


def prefix_pieces(tokenizer, prefix, limit):
    """(N,) valid UTF-8 prefixes -> (pieces (N, None) ragged int32 cut to `limit` (N,)
    pieces each, cut (N,) bool: a prefix had more)."""
    prefix = tf.strings.substr(prefix, tf.zeros_like(limit), (limit + 1) * _CHARS_PER_PIECE,
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
                             (limit + 1) * _CHARS_PER_PIECE, unit="UTF8_CHAR")
    phrases = tf.strings.split(text, sep=PHRASE_SEPARATOR)  # (N, None) strings
    pieces = tokenizer.tokenize(phrases.flat_values)  # (N·P, None)
    pieces = tf.RaggedTensor.from_row_splits(tf.cast(pieces, tf.int32), phrases.row_splits,
                                             validate=False)
    # Flat over the N·P phrases (a ragged reduce or boolean mask adds scores of ops).
    sizes = tf.cast(pieces.values.row_lengths(), tf.int32)  # pieces per phrase
    splits = phrases.row_splits
    text_of = tf.repeat(tf.range(tf.size(splits, out_type=splits.dtype) - 1),
                        splits[1:] - splits[:-1])  # (N·P,) each phrase's text
    ends = tf.cumsum(sizes)
    before = tf.gather(tf.concat([[0], ends], axis=0), splits[:-1])  # (N,) earlier texts'
    running = ends - tf.gather(before, text_of)  # pieces of the text's phrases so far
    fits = (running <= tf.gather(tf.maximum(limit, 0), text_of)) & (sizes > 0)
    kept_sizes = tf.where(fits, sizes, 0)
    return keep_items(pieces, fits), row_sums(sizes, splits) > row_sums(kept_sizes, splits)


def row_sums(values, splits):
    """(N,) the sums of flat `values` over the N rows of `splits` (N + 1,): a running sum
    read at the splits (a ragged `reduce_sum`'s result in fewer ops)."""
    running = tf.concat([tf.zeros([1], values.dtype), tf.cumsum(values)], axis=0)
    return tf.gather(running, splits[1:]) - tf.gather(running, splits[:-1])


def keep_items(ragged, keep):
    """A (N, None, ...) ragged tensor with only the items (rows of `ragged.values`) where
    `keep` (flat bool) is True, in order (`tf.ragged.boolean_mask`'s result, in fewer ops)."""
    splits = ragged.row_splits
    kept = tf.concat([tf.zeros([1], splits.dtype), tf.cumsum(tf.cast(keep, splits.dtype))],
                     axis=0)
    return tf.RaggedTensor.from_row_splits(tf.gather(ragged.values, tf.where(keep)[:, 0]),
                                           tf.gather(kept, splits), validate=False)


def reversed_phrases(phrases):
    """(N, None, None) ragged phrases with each phrase's pieces in reverse order."""
    inner = phrases.values
    lengths, starts = inner.row_lengths(), inner.row_starts()
    index = tf.repeat(starts + lengths - 1, lengths) - tf.ragged.range(lengths).flat_values
    return phrases.with_values(inner.with_flat_values(tf.gather(inner.flat_values, index)))


def chunk_steering(ngram, penalty, prefix, constraints=None):
    """The :class:`Steering` of one chunk: (B,) controls, (B, None) ragged prefixes and
    (B, None, None) ragged constraint phrases (None: none)."""
    tokens, continues = ((), ()) if constraints is None else flatten_constraints(constraints)
    return Steering(ngram, penalty, prefix.to_tensor(PAD_ID),
                    tf.cast(prefix.row_lengths(), tf.int32), tokens, continues)


def steered_lists(search, first_pieces, source, steering, count, k, detokenize,
                  pieces=None):
    """One chunk's n-best lists (translations (B, K), scores (B, K)) by one beam search;
    with `pieces` (:func:`nbest_lists`) also each hypothesis' pieces and their
    log-probabilities ((B, K, L), "" / 0 after its end and for empty cells).

    A text without a prefix, or asking for one hypothesis, gets its beam's n-best list
    (:func:`nbest_lists`). A text with a prefix and `count` > 1 gets the alternatives
    (CTranslate2's `return_alternatives`): `first_pieces(rows, k)` gives the `k` most
    probable pieces after the prefixes of those chunk rows ((rows, k) ids, most probable
    first, and (rows, k) bool usable: not EOS, not impossible); each of the first `count`
    becomes a row of its own whose prefix ends with it, decoded in the same search as the
    other texts, and its best hypothesis is one entry of the list.

    `search(source, steering)` runs the beam search of the chunk's options on rows of
    `source` and returns (ids (R, beam, L) vocabulary ids, lengths, scores (R, beam)),
    with `pieces` also token log-probabilities (R, beam, L).
    """
    batch = tf.shape(source)[0]
    alternative = (steering.prefix_lengths > 0) & (count > 1)
    plain = tf.cast(tf.where(~alternative)[:, 0], tf.int32)  # (Bn,)
    steered = tf.cast(tf.where(alternative)[:, 0], tf.int32)  # (Ba,)
    tokens, usable = first_pieces(steered, k)
    taken = usable & (tf.range(k)[None, :] < tf.gather(count, steered)[:, None])
    pairs = tf.cast(tf.where(taken), tf.int32)  # (A, 2): (steered text, alternative)
    texts = tf.gather(steered, pairs[:, 0])  # (A,) chunk row of each alternative
    prefix = rows_to_ragged(steering.prefix, steering.prefix_lengths)
    extended = tf.concat([tf.gather(prefix, texts),
                          tf.RaggedTensor.from_tensor(tf.gather_nd(tokens, pairs)[:, None])],
                         axis=1)
    rows = tf.concat([plain, texts], axis=0)
    steer = chunk_steering(tf.gather(steering.no_repeat_ngram_size, rows),
                           tf.gather(steering.repetition_penalty, rows),
                           tf.concat([tf.gather(prefix, plain), extended], axis=0))
    if isinstance(steering.constraints, tf.Tensor):  # each row's text's phrases
        steer = steer._replace(
            constraints=tf.gather(steering.constraints, rows),
            constraint_continues=tf.gather(steering.constraint_continues, rows))
    ids, lengths, scores, *token_lps = search(tf.gather(source, rows), steer)
    n = tf.size(plain)
    lists, list_scores, *per_token = nbest_lists(
        ids[:n], lengths[:n], scores[:n], tf.gather(count, plain), k, detokenize,
        *(token_lps[0][:n], pieces) if pieces else ())
    best = detokenize(ids[n:, 0], lengths[n:, 0])
    # (B, K) index into [the plain lists' cells, the alternatives' best, an empty cell]
    cells = n * k + tf.size(texts)
    index = tf.fill([batch, k], cells)
    index = tf.tensor_scatter_nd_update(
        index, tf.stack([tf.repeat(plain, k), tf.tile(tf.range(k), [n])], axis=1),
        tf.range(n * k))
    index = tf.tensor_scatter_nd_update(index, tf.stack([texts, pairs[:, 1]], axis=1),
                                        n * k + tf.range(tf.size(texts)))
    text = tf.concat([tf.reshape(lists, [-1]), best, [""]], axis=0)
    score = tf.concat([tf.reshape(list_scores, [-1]), scores[n:, 0], [-float("inf")]], axis=0)
    if not pieces:
        return tf.gather(text, index), tf.gather(score, index)
    columns = tf.shape(ids)[2]
    best_pieces = pieces(ids[n:, 0], token_lps[0][n:, 0], lengths[n:, 0])
    cells = [tf.gather(tf.concat([tf.reshape(listed, [-1, columns]), alternative,
                                  tf.zeros_like(alternative[:1])], axis=0), index)
             for listed, alternative in zip(per_token, best_pieces, strict=True)]
    return (tf.gather(text, index), tf.gather(score, index), *cells)
