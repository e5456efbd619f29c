"""Word alignments of translations, read from the encoder–decoder attention (§3.2.3).

As CTranslate2's `return_attention` and fairseq's `--print-alignment`: after the search,
each hypothesis is decoded once more, teacher-forced (the full-sequence path, one call
per chunk; the search itself is untouched), and the attention of one decoder layer,
averaged over its heads (and over an ensemble's members), links each target piece to the
source piece it attends most (EOS and padding never chosen). Pieces map to words by
SentencePiece's word-start marker "▁": a word is a whitespace-separated token of the text,
so the indices are those of `text.split()` on both sides. A word pair is listed once.

The result is a Pharaoh string per hypothesis: "i-j" pairs (source word i, target word j,
0-based) separated by spaces, sorted by i then j ("" for an empty hypothesis). A
right-to-left model's pieces are put back in reading order first: its alignments read as
any other's. Which layer aligns best is measured in bench/STUDIES.md ("Alignment layer");
each model reads its own `alignment_layer` and `alignment_heads`
(:class:`tfxformer.config.ModelConfig`: by default the penultimate layer, all heads; a
model trained with guided alignment, its supervised head).

Shapes: N texts, K hypotheses per text, R hypotheses aligned, B rows of one chunk, S
source pieces, T target pieces.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer.data.alignments import WORD_START  # the piece that begins a word
from tfxformer.decoding import model_calls
from tfxformer.decoding.chunking import decode_in_chunks
from tfxformer.decoding.ensemble import members
from tfxformer.decoding.greedy import greedy_decode
from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID
from tfxformer.serving import flat_rows
from tfxformer.serving.markup import put_back
from tfxformer.serving.reading import strip_controls
from tfxformer.serving.text import CHARS_PER_TOKEN, sanitize_utf8

__all__ = ["WORD_START", "align_rows", "nbest_alignments", "pharaoh",
           "place_phrases", "restore_markup", "text_alignments", "translator_alignments",
           "word_index"]

_SHIFT = 2 ** 20  # word indices below it: a word pair packed in one int64 key
_PLACEMENT_CHUNK = 16  # rows decoded at once to place constraints: (16, T, V) logits


def word_index(pieces, real, first=None):
    """(B, L) piece strings and (B, L) bool real pieces -> (B, L) int32 the word of each
    piece: a piece beginning with "▁" begins a word, and so does the first real piece
    (column `first` (B,) int32, default 0: the pieces before it, e.g. a multilingual
    model's language tag, belong to no word)."""
    first = tf.zeros(tf.shape(pieces)[:1], tf.int32) if first is None else first
    column = tf.range(tf.shape(pieces)[1])[None, :]
    marked = tf.equal(tf.strings.substr(pieces, 0, 1, unit="UTF8_CHAR"), WORD_START)
    starts = real & (column >= first[:, None]) & (marked | tf.equal(column, first[:, None]))
    return tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)


def pharaoh(source_words, target_words, real):
    """(B, T) each target piece's linked source word and its own word, (B, T) bool the
    pieces to use -> (B,) Pharaoh strings "i-j ...", each pair once, sorted."""
    at = tf.where(real)  # (P, 2) int64: (row, piece)
    i = tf.cast(tf.gather_nd(source_words, at), tf.int64)
    j = tf.cast(tf.gather_nd(target_words, at), tf.int64)
    key = tf.sort(tf.unique((at[:, 0] * _SHIFT + i) * _SHIFT + j).y)
    rows, i, j = key // _SHIFT ** 2, key // _SHIFT % _SHIFT, key % _SHIFT
    pairs = tf.strings.join([tf.strings.as_string(i), "-", tf.strings.as_string(j)])
    return flat_rows.join_rows(pairs, rows, tf.shape(real)[0], separator=" ")


def _cross_attention(model, source_ids, decoder_inputs, layer):
    """(B, T, S) one member's alignment attention (of `layer`; None: its own)."""
    memory, source_mask = model_calls.encode(model, source_ids)
    return model.cross_attention(decoder_inputs, memory, source_mask, layer)


def align_rows(model, source_ids, target_ids, tokenizer, layer=None,
               reverse_target=False, source_first=None):
    """One chunk's alignments: (B, S) source ids (pieces, EOS, PAD after), (B, T) target
    ids as the model reads them (pieces, EOS, PAD after; a right-to-left model's pieces
    right to left) -> (B,) Pharaoh strings in reading order. `source_first` (B,) int32:
    the source pieces before each text's first word (a language tag), None for none."""
    source_ids = tf.cast(source_ids, tf.int32)
    target_ids = tf.cast(target_ids, tf.int32)
    batch = tf.shape(target_ids)[0]
    inputs = tf.concat([tf.fill([batch, 1], BOS_ID), target_ids[:, :-1]], axis=1)
    models = members(model)
    attention = tf.add_n([_cross_attention(m, source_ids, inputs, layer)
                          for m in models]) / len(models)  # (B, T, S)
    first = tf.zeros([batch], tf.int32) if source_first is None else source_first
    source_real = (source_ids != PAD_ID) & (source_ids != EOS_ID)
    source_real &= tf.range(tf.shape(source_ids)[1])[None, :] >= first[:, None]
    link = tf.argmax(tf.where(source_real[:, None, :], attention, -1.0), axis=2,
                     output_type=tf.int32)  # (B, T)
    target_real = (target_ids != PAD_ID) & (target_ids != EOS_ID)
    if reverse_target:  # reading order: each row's pieces reversed, as the text is
        count = tf.reduce_sum(tf.cast(target_real, tf.int32), axis=1)
        target_ids = tf.reverse_sequence(target_ids, count, seq_axis=1, batch_axis=0)
        link = tf.reverse_sequence(link, count, seq_axis=1, batch_axis=0)
    source_words = word_index(tokenizer.id_to_string(source_ids), source_real, first)
    target_words = word_index(tokenizer.id_to_string(target_ids), target_real)
    return pharaoh(tf.gather(source_words, link, batch_dims=1), target_words, target_real)


def nbest_alignments(model, codec, source, translations, tokenizer, chunk_size,
                     max_output_tokens, layer=None, source_first=None):
    """(N, K) Pharaoh strings of the (N, K) `translations` of N texts read as `source`
    (:class:`tfxformer.serving.text.Source`), "" for an empty one. Each hypothesis is
    read back into pieces by `codec` (:meth:`tfxformer.serving.text.TextCodec.to_target`,
    cut to `max_output_tokens`) and aligned `chunk_size` at a time in order of length;
    `source_first` (N,) int32: each text's pieces before its first word (None: none)."""
    shape = tf.shape(translations)
    flat = tf.reshape(translations, [-1])
    text_row = flat_rows.repeat_each(tf.range(shape[0]), shape[1])
    keep = tf.where(tf.not_equal(flat, "") & ~tf.gather(source.blank, text_row))[:, 0]
    rows = tf.gather(text_row, keep)
    targets, _ = codec.to_target(tf.gather(flat, keep), max_output_tokens, tokenizer)
    sources = tf.gather(source.pieces, rows)
    first = tf.zeros_like(rows) if source_first is None else tf.gather(source_first, rows)

    def align(chunk, _):
        return (align_rows(model, tf.gather(sources, chunk).to_tensor(),
                           tf.gather(targets, chunk).to_tensor(), tokenizer, layer,
                           codec.reverse_target, tf.gather(first, chunk)),)

    (aligned,) = decode_in_chunks(sources.row_lengths() + targets.row_lengths(), chunk_size,
                                  align, (tf.string,))
    out = tf.tensor_scatter_nd_update(tf.fill([tf.size(flat)], ""), keep[:, None], aligned)
    # Every link names a word of either side: read back into pieces, a text may show a
    # word start its whitespace does not make (a lone "▁" piece), pointing past its end.
    target_words = flat_rows.word_counts(flat)
    source_words = None if source.row_words is None else tf.gather(source.row_words, text_row)
    return tf.reshape(_within(out, source_words, target_words), shape)


def _within(alignments, source_words, target_words):
    """(M,) Pharaoh strings without the links i-j where i >= `source_words` (M,) (None:
    any i) or j >= `target_words` (M,)."""
    pairs, cell, i, j = _links(alignments)
    kept = j < tf.gather(target_words, cell)
    if source_words is not None:
        kept &= i < tf.gather(source_words, cell)
    return flat_rows.join_rows(flat_rows.masked(pairs.values, kept),
                               flat_rows.masked(cell, kept), tf.size(alignments), separator=" ")


def _links(alignments):
    """Pharaoh strings (any shape) -> (their links (M, None) ragged strings, each link's
    flat cell (L,) int64, its source word i and target word j (L,) int32)."""
    pairs = tf.strings.split(tf.reshape(alignments, [-1]))
    i = tf.strings.to_number(tf.strings.regex_replace(pairs.values, "-.*", ""), tf.int32)
    j = tf.strings.to_number(tf.strings.regex_replace(pairs.values, ".*-", ""), tf.int32)
    return pairs, flat_rows.row_ids(pairs.row_splits), i, j


def translator_alignments(translator, source, translations, tokenizer, target_language=None):
    """:func:`nbest_alignments` of a :class:`tfxformer.serving.Translator`'s (S, K)
    `translations` of the rows of `source` (:class:`tfxformer.serving.text.Source`), with
    its model, codec, chunk size, output limit and `alignment_layer` (a multilingual
    model's language tag left out)."""
    first = translator.codec.tagged(tf.fill(tf.shape(translations)[:1], ""),
                                    target_language, source.rows)[1]
    return nbest_alignments(translator.model, translator.codec, source, translations,
                            tokenizer, translator.max_batch_size,
                            translator.max_output_tokens, translator.alignment_layer, first)


def text_alignments(source, alignments, translations):
    """(S, K) alignments of the rows' (S, K) `translations` -> (N, K) those of the texts
    the rows are joined into (:class:`tfxformer.serving.reading.Rows`): each row's word
    indices shifted by the words of the text's rows before it, on either side."""
    rows = source.rows
    if not rows.split:
        return alignments
    shape = tf.shape(alignments)
    start = tf.gather(tf.math.unsorted_segment_min(tf.range(shape[0]), rows.text_of,
                                                   rows.texts), rows.text_of)

    def before(counts):  # (S, K) -> the counts of the text's earlier rows
        total = tf.cumsum(counts, axis=0, exclusive=True)
        return total - tf.gather(total, start)

    words = tf.reshape(flat_rows.word_counts(tf.reshape(translations, [-1])), shape)
    source_words = tf.broadcast_to(source.row_words[:, None], shape)
    shift_i = tf.reshape(before(source_words), [-1])
    shift_j = tf.reshape(before(words), [-1])
    pairs, cell, i, j = _links(alignments)  # (S·K, None) links
    links = tf.strings.join([tf.strings.as_string(i + tf.gather(shift_i, cell)), "-",
                             tf.strings.as_string(j + tf.gather(shift_j, cell))])
    # cell r·K + k belongs to text cell text_of[r]·K + k; the rows' links in row order
    group = tf.gather(rows.text_of, cell // tf.cast(shape[1], tf.int64)) * shape[1] + \
        tf.cast(cell % tf.cast(shape[1], tf.int64), tf.int32)
    order = tf.argsort(group, stable=True)
    joined = flat_rows.join_rows(tf.gather(links, order), tf.gather(group, order),
                                 rows.texts * shape[1], separator=" ")
    return tf.reshape(joined, [rows.texts, shape[1]])


def restore_markup(translator, source, texts, translations, tokenizer, target_language=None,
                   alignments=None, scores=None):
    """A translator's (N,) or (N, K) `texts` (its rows' (S,) or (S, K) `translations`
    joined), with the texts' inline markup put back
    (:func:`tfxformer.serving.markup.put_back`) at the target words the rows'
    `alignments` (Pharaoh strings shaped as `translations`; None: aligned here, the rows of
    texts with markup only) link; as given where `source` holds no markup. With n-best
    `scores`, a cell of score -inf (no hypothesis) stays ""."""
    if source.markup is None:
        return texts

    def restored():
        wide = translations if translations.shape.rank == 2 else translations[:, None]
        if alignments is None:
            marked = tf.where(source.rows.per_row(source.markup.marked)[:, None], wide, "")
            aligned = translator_alignments(translator, source, marked, tokenizer,
                                            target_language)
        else:
            aligned = tf.reshape(alignments, tf.shape(wide))
        links = tf.reshape(text_alignments(source, aligned, wide), tf.shape(texts))
        return put_back(source.markup, texts, links)

    # a request without markup takes none of the work
    out = tf.cond(tf.reduce_any(source.markup.marked), restored, lambda: texts)
    return out if scores is None else tf.where(scores > -float("inf"), out, "")


def place_phrases(translator, source, constraints, tokenizer, first_rows):
    """(S,) the constraints of each row of `source` (phrases separated by TAB): each
    phrase of a text's (N,) `constraints` goes to the text's row (sentence) where it fits,
    the row whose unconstrained translation makes the phrase's pieces likeliest: each row
    of such a text decoded greedily, then teacher-forced once (`_PLACEMENT_CHUNK` rows at
    a time), and a phrase's fit to a row is the sum over its pieces of the piece's highest
    log-probability at any position of that translation (an ensemble's members
    averaged). Phrases keep their order within a row; a blank row takes none, nor does a
    blank text's. `first_rows` (S,): what to return where no text of several rows (not
    blank) has constraints (each text's on its first row); such a request takes none of
    the work."""
    rows = source.rows
    counts = rows.counts()  # (N,) rows of each text
    several = (counts > 1) & tf.not_equal(constraints, "")
    decoded = tf.gather(several, rows.text_of) & ~source.blank  # (S,) the rows to decode

    def placed():
        # read as the request reads them (nbest_request.constraint_phrases), cut to what
        # the longest output can use
        text = tf.strings.substr(strip_controls(sanitize_utf8(constraints)), 0,
                                 (translator.max_output_tokens + 1) * CHARS_PER_TOKEN,
                                 unit="UTF8_CHAR")
        phrases = tf.strings.split(text, sep="\t")  # (N, None)
        text = flat_rows.row_ids(tf.cast(phrases.row_splits, tf.int32))  # (Q,) each phrase's text
        # a blank text's phrases are ignored; an empty phrase is none
        keep = tf.where((tf.gather(counts, text) > 0) & (phrases.flat_values != ""))[:, 0]
        text, flat = tf.gather(text, keep), tf.gather(phrases.flat_values, keep)
        starts = tf.cumsum(counts, exclusive=True)  # a text's rows are consecutive
        offset = tf.range(tf.maximum(tf.reduce_max(counts), 1))[None, :]
        valid = offset < tf.gather(counts, text)[:, None]  # (Q, R) the text's rows
        candidate = tf.where(valid, tf.gather(starts, text)[:, None] + offset, 0)
        valid &= tf.gather(decoded, candidate)
        wanted = tf.where(decoded)[:, 0]
        pieces = tf.gather(source.pieces, wanted)
        models = members(translator.model)

        def best_of(chunk, _):  # (B, V) each piece's best log-probability in each row
            ids = tf.gather(pieces, chunk).to_tensor(default_value=PAD_ID)
            greedy = greedy_decode(models, ids, max_output_length=translator.max_output_tokens)
            inputs = tf.concat([tf.fill([tf.shape(ids)[0], 1], BOS_ID),
                                tf.cast(greedy.ids[:, :-1], tf.int32)], axis=1)
            steps = tf.range(tf.shape(inputs)[1])[None, :] < tf.cast(
                greedy.lengths, tf.int32)[:, None]  # the positions of each translation
            best = 0.0
            for model in models:
                memory, mask = model_calls.encode(model, ids)
                log_probs = tf.nn.log_softmax(model_calls.decode(model, inputs, memory, mask))
                best += tf.reduce_max(tf.where(steps[:, :, None], log_probs, -1e9), axis=1)
            return (best / len(models),)

        (best,) = decode_in_chunks(pieces.row_lengths(), _PLACEMENT_CHUNK, best_of,
                                   (tf.float32,), ranks=[2])  # (W, V)
        slot = tf.tensor_scatter_nd_update(  # each decoded row's place in `best` (0 else)
            tf.zeros_like(rows.text_of), tf.cast(wanted[:, None], tf.int32),
            tf.range(tf.size(wanted)))
        phrase = tf.cast(tokenizer.tokenize(flat), tf.int32)  # (Q, None)
        phrase_of = flat_rows.row_ids(tf.cast(phrase.row_splits, tf.int32))  # (P,) its phrase
        slots = tf.gather(tf.gather(slot, candidate), phrase_of)  # (P, R)
        fit = tf.gather_nd(best, tf.stack(  # each piece's best in each row of its text
            [slots, tf.broadcast_to(phrase.flat_values[:, None], tf.shape(slots))], axis=-1))
        score = tf.math.unsorted_segment_sum(fit, phrase_of, tf.size(flat))  # (Q, R)
        choice = tf.argmax(tf.where(valid, score, -float("inf")), axis=1,
                           output_type=tf.int32)
        row = tf.gather(candidate, choice, batch_dims=1)  # (Q,) a row of the phrase's text
        order = tf.argsort(row, stable=True)
        return flat_rows.join_rows(tf.gather(flat, order), tf.gather(row, order),
                                   tf.size(rows.text_of), separator="\t")

    return tf.cond(tf.reduce_any(decoded), placed, lambda: first_rows)
