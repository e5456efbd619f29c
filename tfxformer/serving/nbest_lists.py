"""The graph of `translate_nbest` (:func:`translate_nbest`): a request
(:mod:`tfxformer.serving.nbest_request`) decoded chunk by chunk into n-best lists, which
are then aligned to their texts and get the texts' markup back.

Texts with equal beam size, α and extra length are decoded together, `chunk_size` at a
time in order of length (:func:`tfxformer.decoding.chunking.decode_in_chunks`), each chunk
by one steered beam search (:meth:`tfxformer.serving.search.Search.steered`). A text
without a prefix, or asking for one hypothesis, gets its beam's n-best list; with a
prefix the list holds the alternatives at the first position after it, each continued by
its own search (CTranslate2's `return_alternatives`).

Shapes: N texts, A texts decoded (not blank), B texts of one chunk, K hypotheses per text
(the batch's largest `num_hypotheses`), L output columns, T piece columns.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.decoding.chunking import decode_in_chunks
from tfxformer.decoding.common import NEG_INF, rows_to_ragged
from tfxformer.decoding.steering import Steering, flatten_constraints
from tfxformer.ids import PAD_ID
from tfxformer.serving import flat_rows, nbest_request
from tfxformer.serving.alignment import (
    place_phrases,
    restore_markup,
    text_alignments,
    translator_alignments,
)
from tfxformer.serving.inputs import input_limits, option_keys, per_text

__all__ = ["chunk_steering", "nbest_lists", "nbest_outputs", "steered_lists", "translate_nbest"]


def nbest_outputs(search, codec, source, request, k, tokenizer, chunk_size, token_scores,
                  blank_warning=""):
    """The outputs of `translate_nbest` (:meth:`tfxformer.serving.Translator.nbest`) for
    N texts: `source` (:class:`tfxformer.serving.text.Source`, S rows) and `request`
    (:class:`tfxformer.serving.nbest_request.NBestRequest`, per row) theirs, decoded by
    `search` (:class:`tfxformer.serving.search.Search`) and written by `codec`
    (:class:`tfxformer.serving.text.TextCodec`); `k` () int32 the list length. A text's
    hypothesis j is its rows' j-th joined, its score their sum, its pieces theirs one
    after another; its warning its rows' joined (`blank_warning` (N,) without rows)."""
    active = source.decoded_rows()
    pieces, decoded = tf.gather(source.pieces, active), request.rows(active)
    columns = search.options.max_output_tokens

    def decode(rows, _):
        source_ids = tf.gather(pieces, rows).to_tensor()  # (B, S)
        first = {name: value[rows[0]] for name, value in decoded.options.items()}
        prefix, phrases = tf.gather(decoded.prefix, rows), tf.gather(decoded.phrases, rows)
        ngram, penalty = tf.gather(decoded.ngram, rows), tf.gather(decoded.penalty, rows)
        steer = chunk_steering(ngram, penalty, prefix, phrases)
        # the prefixes' and phrases' pieces are in the shortlist too
        shortlist = search.shortlist(source_ids, tf.concat([prefix.flat_values,
                                                            phrases.flat_values], axis=0))

        def steered(source, steer):
            return search.steered(source, first, steer, shortlist, token_scores)

        def first_pieces(rows, k):
            return search.first_pieces(tf.gather(source_ids, rows),
                                       tf.gather(steer.prefix, rows),
                                       tf.gather(steer.prefix_lengths, rows),
                                       tf.gather(ngram, rows), tf.gather(penalty, rows), k,
                                       shortlist)

        def to_text(ids, lengths):
            return codec.to_text(ids, lengths, tokenizer)

        count = tf.gather(decoded.count, rows)
        if not token_scores:
            return steered_lists(steered, first_pieces, source_ids, steer, count, k, to_text)
        *lists, words, values = steered_lists(steered, first_pieces, source_ids, steer, count,
                                              k, to_text, codec.reading_order)
        # every chunk's columns alike (decode_in_chunks concatenates them)
        pad = [[0, 0], [0, 0], [0, columns - tf.shape(words)[2]]]
        return (*lists, tf.pad(words, pad), tf.pad(values, pad))

    dtypes, ranks = (tf.string, tf.float32), (2, 2)
    if token_scores:
        dtypes, ranks = dtypes + (tf.int32, tf.float32), ranks + (3, 3)
    lists = decode_in_chunks(tf.cast(pieces.row_lengths(), tf.int32), chunk_size, decode,
                             dtypes, ranks, keys=option_keys(decoded.options))
    first = tf.range(k) == 0  # a blank text's list: the empty translation with score 0
    blank_scores = tf.where(first, 0.0, -float("inf"))
    # a text's hypothesis j: its sentences' j-th ones joined, scored by their sum
    scores = source.rows.sum(source.restore(lists[1], blank_scores), blank_scores)
    row_translations = source.restore(lists[0], tf.fill([k], ""))
    translations = source.to_texts(row_translations)
    outputs = {"translations": tf.where(scores > -float("inf"), translations, ""),
               # (S, K) as joined (cleaned): what alignments read; the caller pops it
               "row_translations": source.rows.clean(row_translations, source.unknown),
               "scores": scores, "truncated": source.text_truncated(),
               "warning": source.rows.notes(request.warning, blank_warning)}
    if not token_scores:
        return outputs
    ids, values = (source.restore(per_token, tf.zeros([k, columns], per_token.dtype))
                   for per_token in lists[2:])
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.int32), axis=2)
    ids, values = source.rows.concat(ids, lengths), source.rows.concat(values, lengths)
    used = tf.reduce_max(tf.concat([tf.reshape(tf.reduce_sum(
        tf.cast(tf.not_equal(ids, PAD_ID), tf.int32), axis=2), [-1]), [0]], axis=0))
    ids = ids[:, :, :used]  # the pieces' strings only of the columns in use
    return {**outputs, "tokens": codec.piece_strings(ids, tokenizer),
            "token_log_probs": values[:, :, :used]}


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
        index, tf.stack([flat_rows.repeat_each(plain, k), tf.tile(tf.range(k), [n])], axis=1),
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


def translate_nbest(translator, text, beam_size, alpha, extra_length, max_input_tokens,
                    num_hypotheses, no_repeat_ngram_size=0, repetition_penalty=1.0,
                    target_prefix="", constraints="", target_language=None,
                    token_scores=True):
    """The graph behind `translate_nbest` (:meth:`tfxformer.serving.Translator.nbest`):
    each text's `num_hypotheses` best translations by beam search, every option one value
    per text ((N,) tensors, or scalars for all; docs/steering.md).

    Texts are read as `Translator.translate` reads them (invalid UTF-8 replaced, cut to
    `max_input_tokens`, blank ones never decoded); texts with equal beam size, α and
    extra length are decoded together, `max_batch_size` at a time in order of length.
    `no_repeat_ngram_size` (0: off) and `repetition_penalty` (1: off) are
    :mod:`tfxformer.decoding.steering`'s. A `target_prefix` ("": none) is read as a
    text is, its pieces forced as the start of every hypothesis (cut to the text's
    output limit less one); with one, a list of more than one holds the alternatives
    at the first position after the prefix, each continued by a beam search of its
    own (CTranslate2's `return_alternatives`), in the order of their probabilities.
    `constraints` ("": none) are phrases separated by TAB, each read as a text is:
    every hypothesis that ends before its output limit holds each phrase's pieces
    (:mod:`tfxformer.decoding.constraints`); the last phrases are left out where a
    text's would exceed its output limit less one piece. `token_scores` (a Python
    bool; True for the signature): also each hypothesis' pieces and their
    log-probabilities (False: the graph without them, e.g. for reranking).

    Returns:
        {"translations": (N, K) tf.string, best first, "scores": (N, K) float32 (as
        :meth:`translate`'s `score`), "truncated": (N,) bool, "warning": (N,)
        tf.string, "" or what was changed in a text's request (a prefix cut to the
        output limit, or ignored; constraints cut or ignored), "tokens": (N, K, T)
        tf.string each hypothesis' SentencePiece pieces (EOS "</s>"), "" after them,
        "token_log_probs": (N, K, T) float32 each piece's log-probability under the
        (steered) distribution the search used, 0 after them, summing to score ×
        length normalizer, "alignments": (N, K) tf.string each hypothesis' word
        alignment to its text, Pharaoh "i-j" pairs (:mod:`tfxformer.serving.alignment`,
        decoder layer `alignment_layer`)}, K the largest `num_hypotheses`; beyond a text's
        own count (or where the search found fewer hypotheses) "" with score -inf; a
        blank text's list is "" with score 0 (no pieces).
    """
    text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
    size = tf.size(text)
    options = nbest_request.checked_options(size, beam_size, alpha, extra_length,
                                            num_hypotheses, no_repeat_ngram_size,
                                            repetition_penalty)
    tokenizer = translator.make_tokenizer()
    limits = input_limits(max_input_tokens, size, translator.max_input_tokens)
    source = translator.read(text, limits, target_language)
    rows = nbest_request.per_row(options, source.rows)
    lengths = tf.cast(source.pieces.row_lengths(), tf.int32)
    # the pieces a prefix or constraints may take: the output limit less one
    limit = tf.minimum(translator.max_output_tokens,
                       lengths + rows.options["extra_length"]) - 1
    prefix, row_constraints, blank = nbest_request.first_rows(size, source.rows,
                                                              target_prefix, constraints)
    if source.rows.split:  # each phrase to the sentence it fits (docs/robust_input.md)
        row_constraints = place_phrases(
            translator, source, per_text(constraints, size, "constraints", tf.string),
            tokenizer, row_constraints)
    request = nbest_request.read_request(rows, prefix, row_constraints, tokenizer, limit,
                                         source.blank, translator.reverse_target)
    outputs = nbest_outputs(translator.search, translator.codec, source, request,
                            nbest_request.width(options.count), tokenizer,
                            translator.max_batch_size, token_scores, blank)
    row_translations, alignments = outputs.pop("row_translations"), None
    if token_scores:
        alignments = translator_alignments(translator, source, row_translations, tokenizer,
                                           target_language)
        outputs["alignments"] = text_alignments(source, alignments, row_translations)
    outputs["translations"] = restore_markup(
        translator, source, outputs["translations"], row_translations, tokenizer,
        target_language, alignments, outputs["scores"])
    return outputs
