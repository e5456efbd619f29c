"""String-to-string translation in one TensorFlow graph (§6.1 decoding), ready to export.

Shapes: N input strings, B sentences of one chunk, S source length, K beam size.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfxformer import checks, multilingual
from tfxformer.config import DecodingOptions
from tfxformer.data.tokenizer import sentencepiece_tokenizer
from tfxformer.decoding import beam_search, greedy_decode, model_calls
from tfxformer.decoding.chunking import decode_in_chunks
from tfxformer.decoding.common import NEG_INF, followed_in_row, next_token_log_probs, rows_to_ragged
from tfxformer.decoding.ensemble import check_members, members
from tfxformer.decoding.sampling import fold_seed, seed_key
from tfxformer.decoding.scoring import next_logits, score_ragged
from tfxformer.decoding.shortlist import check_table, shortlist_ids
from tfxformer.decoding.steering import Steering, steer_logits
from tfxformer.ids import EOS_ID, PAD_ID
from tfxformer.serving import steering
from tfxformer.serving.compiled import CompiledSearch

# Raw input is cut to this many characters per allowed token before tokenizing, so a
# huge string costs little: a BPE piece spans at most 16 characters (SentencePiece's
# default max_sentencepiece_length), and runs of whitespace are collapsed.
_CHARS_PER_TOKEN = 64
_REPLACEMENT_CHAR = 0xFFFD  # U+FFFD, in place of invalid UTF-8

_TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
_LANGUAGE_SPEC = tf.TensorSpec([None], tf.string, name="target_language")
_OPTION_SPECS = (tf.TensorSpec([], tf.int32, name="beam_size"),
                tf.TensorSpec([], tf.float32, name="alpha"),
                tf.TensorSpec([], tf.int32, name="extra_length"))
_EXAMPLE_OPTION_SPECS = (tf.TensorSpec([None], tf.int32, name="beam_size"),
                        tf.TensorSpec([None], tf.float32, name="alpha"),
                        tf.TensorSpec([None], tf.int32, name="extra_length"),
                        tf.TensorSpec([None], tf.int32, name="max_input_tokens"))
_SAMPLING_SPECS = (tf.TensorSpec([], tf.int32, name="sampling_topk"),
                   tf.TensorSpec([], tf.float32, name="sampling_temperature"),
                   tf.TensorSpec([], tf.float32, name="sampling_topp"),
                   tf.TensorSpec([], tf.int32, name="extra_length"),
                   tf.TensorSpec([], tf.int64, name="seed"))
_TARGET_SPEC = tf.TensorSpec([None], tf.string, name="target")


def _signature(*specs):
    """A signature's `tf.function`. The translator is graph code (tf.while_loop, tf.cond):
    traced without AutoGraph, which would convert every Keras call it reaches (a third of
    an export's time). Every signature of a translator calls one encoder function per
    model (:mod:`tfxformer.decoding.model_calls`): an export traces and holds the encoder once."""
    def decorate(method):
        @functools.wraps(method)
        def traced(self, *args):
            with model_calls.traced_once(self._shared_functions):
                return method(self, *args)

        return tf.function(traced, input_signature=list(specs), autograph=False)

    return decorate


def sanitize_utf8(text):
    """(N,) strings -> valid UTF-8, invalid bytes replaced by U+FFFD (core TF op)."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=_REPLACEMENT_CHAR)


def _checked(tensor, condition, message):
    """`tensor`, computed only after the scalar bool `condition` held (InvalidArgument)."""
    with tf.control_dependencies([tf.debugging.Assert(condition, [message])]):
        return tf.identity(tensor)


def _concat(array, empty, dtype):
    """TensorArray.concat(), or a (0,) tensor: concat() of zero elements has no shape."""
    return tf.cond(empty, lambda: tf.zeros([0], dtype), array.concat)


def make_translator(model, sentencepiece_model: bytes, target_languages=(), **options):
    """A :class:`Translator`, or a :class:`MultilingualTranslator` for a multilingual
    model (`target_languages`: its languages, e.g. ("de", "fr"); () for one target)."""
    if target_languages:
        return MultilingualTranslator(model, sentencepiece_model, target_languages, **options)
    return Translator(model, sentencepiece_model, **options)


class Translator(tf.Module):
    """Translates a batch of strings: tokenize → encode → beam search → detokenize (§6.1).

    Everything runs in the graph of a `tf.function`, so the module exports as a
    SavedModel that needs only TensorFlow and tensorflow-text (see
    :func:`tfxformer.serving.export_translator`). SentencePiece runs in-graph
    (`tensorflow_text.SentencepieceTokenizer`, the model bytes embedded). Each source
    is its pieces, cut to `max_input_tokens` (EOS included), then EOS. Inputs are sorted
    by token length and translated in chunks of `max_batch_size` (little padding);
    outputs come back in input order.

    Any input is accepted: invalid UTF-8 is replaced by U+FFFD before tokenizing; an
    input with no SentencePiece piece (empty, or only whitespace) gets the empty
    translation with score 0 and never reaches the model; over-long inputs are cut and
    flagged in `truncated`; an empty batch gives empty outputs. Each output is valid UTF-8.

    Args:
        model: a built or unbuilt :class:`tfxformer.Transformer` with trained weights, or
            a list or tuple of them sharing the vocabulary: an ensemble, whose beam search
            scores each step with the members' averaged probabilities
            (:mod:`tfxformer.decoding.ensemble`) and whose limits are those of the
            smallest position table. `models` lists the members; `model` is the one model,
            or that list.
        sentencepiece_model: the bytes of `spm.model` (ids pad 0, unk 1, bos 2, eos 3).
        beam_size, alpha, extra_length: decoding defaults (None: those of
            :class:`tfxformer.config.DecodingOptions`, 4, 0.6, 50: §6.1, output length
            limit = source length + `extra_length`).
        max_batch_size: sentences decoded together (None: `DecodingOptions.batch_size`,
            64).
        max_input_tokens: source tokens kept, EOS included (None: 256, at most the
            model's positions).
        max_output_tokens: the decode limit, EOS included, whatever the source length
            (None: 256, at most the model's positions).
        shortlist: None (the full vocabulary), or a
            :class:`tfxformer.decoding.ShortlistTable` for the model's vocabulary: each
            chunk is then decoded over its shortlist only (the table rows of its source
            tokens, the frequent target tokens and the special ids;
            :mod:`tfxformer.decoding.shortlist`); scores are normalized over it. The table is
            held in two int32 tf.Variables, `shortlist_table` (V, K) and
            `shortlist_frequent` (N,), saved with the export.
        stopping, length_normalization: beam search's stopping rule ("bound" or
            "finished") and length normalization ("gnmt" or "length"; None: those of
            :class:`tfxformer.config.DecodingOptions`; :func:`tfxformer.decoding.beam_search`).
            Fixed in the graph, for every signature: an export records them in its
            config.json (`decoding`); they are no request input.
        reverse_target: the model writes targets right to left (trained with
            `reverse_target`, :class:`tfxformer.train_config.TrainConfig`): each output's
            pieces are put back in reading order before detokenizing
            (:meth:`detokenize`), and each target given to `score` is reversed before it
            is scored. An export takes it from the run record (`train.reverse_target`).
        xla_max_batch: chunks of at most this many sentences run an XLA-compiled beam
            search (:mod:`tfxformer.serving.compiled`: a smaller fixed cost per decoder
            step, one program per padded shape); 0 (the default here; exports default
            to :data:`tfxformer.serving.compiled.DEFAULT_MAX_BATCH`) turns it off.

    Call (`__call__`, signature `serving_default`):
        text: (N,) tf.string. Returns {"translation": (N,) tf.string, "score": (N,)
        float32, "truncated": (N,) bool}, the score being log P(Y | X) / lp(Y) of the best
        hypothesis (/ |Y|^α with `length_normalization` "length"), `truncated` True where
        the input was cut to `max_input_tokens`.
    `translate_with_options(text, beam_size, alpha, extra_length)` takes the options as
    scalar tensors (int32, float32, int32; not batchable by TF Serving) and returns the
    same; `translate_per_example(text, beam_size, alpha, extra_length, max_input_tokens)`
    takes one value of each per text ((N,) int32, float32, int32, int32), so TF Serving
    can batch it; a `max_input_tokens` above the export's is lowered to it.
    `translate_sampled(text, sampling_topk, sampling_temperature, sampling_topp,
    extra_length, seed)` (scalars: int32, float32, float32, int32, int64) samples one
    translation per text instead of beam search (:mod:`tfxformer.decoding.sampling`;
    `score` is then the sample's log P(Y | X)); the same seed and texts give the same
    translations. `score(text, target)` ((N,) strings each) scores given translations
    (:meth:`score_pairs`). `translate_nbest(text, beam_size, alpha, extra_length,
    max_input_tokens, num_hypotheses, no_repeat_ngram_size, repetition_penalty,
    target_prefix, constraints)` (one value of each per text) returns n-best lists
    ("translations" and "scores" (N, K), "truncated", "warning"; :meth:`nbest`,
    docs/steering.md).

    Example:
    >>> translator = Translator(model, open("runs/base/spm.model", "rb").read())
    >>> translator(tf.constant(["A dog runs.", ""]))["translation"]
    """

    target_languages: tuple[str, ...] = ()  # a MultilingualTranslator's

    def __init__(self, model, sentencepiece_model: bytes, beam_size=None, alpha=None,
                 extra_length=None, max_batch_size=None, max_input_tokens=None,
                 max_output_tokens=None, name="translator", shortlist=None, stopping=None,
                 length_normalization=None, reverse_target=False, xla_max_batch=0):
        super().__init__(name=name)
        self.reverse_target = bool(reverse_target)
        if not isinstance(sentencepiece_model, bytes) or not sentencepiece_model:
            raise ValueError("`sentencepiece_model` must be the non-empty bytes of spm.model, "
                             f"got {type(sentencepiece_model).__name__}.")
        models = members(model)
        positions = check_members(models)
        for member in models:
            if not member.built:
                member.build()
        self.models = models  # tracked: every member's variables are the module's
        # Each member's encoder and decoder functions, traced once for all the signatures.
        self.__dict__["_shared_functions"] = {}  # untracked: holds the models again
        self.model = models[0] if len(models) == 1 else self.models
        self.sentencepiece_model = sentencepiece_model  # also written as an export asset
        options = DecodingOptions().replace(
            beam_size=beam_size, alpha=alpha, extra_length=extra_length,
            batch_size=max_batch_size, max_input_tokens=max_input_tokens,
            max_output_tokens=max_output_tokens, stopping=stopping,
            length_normalization=length_normalization).validate()
        self.options = options.replace(
            max_input_tokens=min(positions, options.max_input_tokens),
            max_output_tokens=min(positions, options.max_output_tokens))
        self.beam_size, self.alpha = self.options.beam_size, float(self.options.alpha)
        self.extra_length = self.options.extra_length
        self.max_batch_size = self.options.batch_size
        self.max_input_tokens = self.options.max_input_tokens
        self.max_output_tokens = self.options.max_output_tokens
        # Chunks of at most xla_max_batch sentences run an XLA-compiled search.
        self.xla_max_batch = checks.integer(xla_max_batch, "xla_max_batch", 0)
        self.compiled_search = None if not self.xla_max_batch else CompiledSearch(
            self.model, self.beam_size, self.extra_length, self.max_output_tokens,
            self.max_input_tokens, self.options.stopping,
            self.options.length_normalization, self.xla_max_batch)
        self.shortlist_info = None
        if shortlist is not None:
            table = check_table(shortlist, int(models[0].model_config.vocab_size))
            self.shortlist_info = dict(table.info, table_shape=list(table.table.shape),
                                       frequent_ids=int(table.frequent.size))
            self.shortlist_table = tf.Variable(table.table, trainable=False,
                                               name="shortlist_table")
            self.shortlist_frequent = tf.Variable(table.frequent, trainable=False,
                                                  name="shortlist_frequent")

    @property
    def shortlist_variables(self):
        """The shortlist's (table, frequent) tf.Variables, or () without a shortlist."""
        if self.shortlist_info is None:
            return ()
        return (self.shortlist_table, self.shortlist_frequent)

    @property
    def max_input_length(self):
        """Former name of `max_input_tokens`."""
        return self.max_input_tokens

    @_signature(_TEXT_SPEC)
    def __call__(self, text):
        return self.translate(text)

    @_signature(_TEXT_SPEC, *_OPTION_SPECS)
    def translate_with_options(self, text, beam_size, alpha, extra_length):
        return self.translate(text, beam_size, alpha, extra_length)

    @_signature(_TEXT_SPEC, *_EXAMPLE_OPTION_SPECS)
    def translate_per_example(self, text, beam_size, alpha, extra_length, max_input_tokens):
        return self.translate(text, beam_size, alpha, extra_length, max_input_tokens)

    @_signature(_TEXT_SPEC, *_SAMPLING_SPECS)
    def translate_sampled(self, text, sampling_topk, sampling_temperature, sampling_topp,
                          extra_length, seed):
        return self.translate(text, extra_length=extra_length, sampling=dict(
            sampling_topk=sampling_topk, sampling_temperature=sampling_temperature,
            sampling_topp=sampling_topp, seed=seed))

    @_signature(_TEXT_SPEC, *steering.NBEST_SPECS)
    def translate_nbest(self, text, beam_size, alpha, extra_length, max_input_tokens,
                        num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                        target_prefix, constraints):
        return self.nbest(text, beam_size, alpha, extra_length, max_input_tokens,
                          num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                          target_prefix, constraints)

    @_signature(_TEXT_SPEC, _TARGET_SPEC)
    def score(self, text, target):
        return self.score_pairs(text, target)

    def nbest(self, text, beam_size, alpha, extra_length, max_input_tokens, num_hypotheses,
              no_repeat_ngram_size=0, repetition_penalty=1.0, target_prefix="",
              constraints="", target_language=None, token_scores=True):
        """The graph behind `translate_nbest`: each text's `num_hypotheses` best
        translations by beam search, every option one value per text ((N,) tensors, or
        scalars for all; docs/steering.md).

        Texts are read as :meth:`translate` reads them (invalid UTF-8 replaced, cut to
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
            length normalizer}, K the largest `num_hypotheses`; beyond a text's
            own count (or where the search found fewer hypotheses) "" with score -inf; a
            blank text's list is "" with score 0 (no pieces).
        """
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        text, tag_pieces = self._with_language(text, target_language)
        size = tf.size(text)
        options = self._example_options(text, dict(beam_size=beam_size, alpha=alpha,
                                                   extra_length=extra_length))
        count = steering.hypothesis_counts(num_hypotheses, options["beam_size"], size)
        ngram, penalty = steering.repetition_controls(no_repeat_ngram_size,
                                                      repetition_penalty, size)
        k = steering.width(count)
        tokenizer = self.make_tokenizer()
        pieces, truncated, blank = self._cut(text, tokenizer, self._input_limit(
            text, max_input_tokens), tag_pieces)
        limit = tf.minimum(self.max_output_tokens, tf.cast(pieces.row_lengths(), tf.int32)
                           + options["extra_length"]) - 1
        prefix, warning = self._prefixes(target_prefix, size, tokenizer, limit, blank)
        phrases, warning = self._constraints(constraints, size, tokenizer, limit, blank,
                                             warning)
        active = tf.where(~blank)[:, 0]
        pieces, prefix = tf.gather(pieces, active), tf.gather(prefix, active)
        phrases = tf.gather(phrases, active)
        options = {name: tf.gather(value, active) for name, value in options.items()}
        count, ngram, penalty = (tf.gather(v, active) for v in (count, ngram, penalty))
        keys = tf.stack([options["beam_size"], tf.bitcast(options["alpha"], tf.int32),
                         options["extra_length"]], axis=1)

        def decode(rows, _):
            source = tf.gather(pieces, rows).to_tensor()
            first = {name: value[rows[0]] for name, value in options.items()}
            steer = steering.chunk_steering(tf.gather(ngram, rows), tf.gather(penalty, rows),
                                            tf.gather(prefix, rows), tf.gather(phrases, rows))
            shortlist = None
            if self.shortlist_info is not None:  # the prefixes' and phrases' pieces too
                shortlist = shortlist_ids(source, self.shortlist_table, tf.concat(
                    [self.shortlist_frequent, tf.gather(prefix, rows).flat_values,
                     tf.gather(phrases, rows).flat_values], axis=0))

            def search(source, steer):
                return self._steered_search(source, first, steer, shortlist, token_scores)

            def first_pieces(rows, k):
                return self._first_pieces(tf.gather(source, rows), tf.gather(steer.prefix, rows),
                                          tf.gather(steer.prefix_lengths, rows), tf.gather(
                                              ngram, rows), tf.gather(penalty, rows),
                                          k, shortlist)

            def detokenize(ids, lengths):
                return self.detokenize(ids, lengths, tokenizer)

            if not token_scores:
                return steering.steered_lists(search, first_pieces, source, steer,
                                              tf.gather(count, rows), k, detokenize)
            *lists, words, values = steering.steered_lists(
                search, first_pieces, source, steer, tf.gather(count, rows), k, detokenize,
                self._token_pieces)
            # every chunk's columns alike (decode_in_chunks concatenates them)
            pad = [[0, 0], [0, 0], [0, self.max_output_tokens - tf.shape(words)[2]]]
            return (*lists, tf.pad(words, pad), tf.pad(values, pad))

        lengths = tf.cast(pieces.row_lengths(), tf.int32)
        if not token_scores:
            lists = decode_in_chunks(lengths, self.max_batch_size, decode,
                                     (tf.string, tf.float32), (2, 2), keys)
            translations, scores = steering.with_blank_rows(blank, *lists, k)
            return {"translations": translations, "scores": scores, "truncated": truncated,
                    "warning": warning}
        lists = decode_in_chunks(
            lengths, self.max_batch_size, decode,
            (tf.string, tf.float32, tf.int32, tf.float32), (2, 2, 3, 3), keys)
        translations, scores, ids, values = steering.with_blank_rows(blank, *lists[:2], k,
                                                                     *lists[2:])
        used = tf.reduce_max(tf.concat([tf.reshape(tf.reduce_sum(
            tf.cast(tf.not_equal(ids, PAD_ID), tf.int32), axis=2), [-1]), [0]], axis=0))
        ids = ids[:, :, :used]  # the pieces' strings only of the columns in use
        words = tf.where(tf.equal(ids, EOS_ID), "</s>", tokenizer.id_to_string(ids))
        return {"translations": translations, "scores": scores, "truncated": truncated,
                "warning": warning, "tokens": tf.where(tf.equal(ids, PAD_ID), "", words),
                "token_log_probs": values[:, :, :used]}

    def _token_pieces(self, ids, values, lengths):
        """Hypotheses' ids (R, L), token log-probabilities (R, L) and lengths (R,) ->
        (their ids (R, L), PAD after the end; their log-probabilities, 0 after the end),
        in reading order (a right-to-left model's, `reverse_target`, put back as
        :meth:`detokenize` does, its EOS last)."""
        if self.reverse_target:
            text = _without_eos(ids, lengths)
            ids = tf.reverse_sequence(ids, text, seq_axis=1, batch_axis=0)
            values = tf.reverse_sequence(values, text, seq_axis=1, batch_axis=0)
        real = tf.range(tf.shape(ids)[1])[None, :] < tf.cast(lengths, tf.int32)[:, None]
        return tf.where(real, tf.cast(ids, tf.int32), PAD_ID), tf.where(real, values, 0.0)

    def _prefixes(self, target_prefix, size, tokenizer, limit, blank):
        """(N,) prefixes -> ((N, None) ragged pieces cut to `limit` (N,), (N,) warnings):
        invalid UTF-8 replaced; a right-to-left model's (`reverse_target`) and a blank
        text's prefix ignored."""
        given = steering.per_text(target_prefix, size, "target_prefix", tf.string)
        text = sanitize_utf8(given)
        prefix, cut = steering.prefix_pieces(tokenizer, text, limit)
        has = prefix.row_lengths() > 0
        ignored = has & (blank | self.reverse_target)
        lengths = prefix.row_lengths()
        prefix = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(prefix.values, tf.repeat(~ignored, lengths)),
            tf.where(ignored, tf.zeros_like(lengths), lengths), validate=False)
        notes = [(cut & ~ignored, tf.strings.join(["target_prefix cut to ",
                                                   tf.strings.as_string(limit),
                                                   " pieces (the output limit less one)"])),
                 (tf.not_equal(text, given), "invalid UTF-8 in target_prefix replaced by "
                                             "U+FFFD"),
                 (has & blank, "blank text: target_prefix ignored")]
        if self.reverse_target:
            notes.append((has, "target_prefix ignored: the model writes right to left"))
        return prefix, _with_notes(tf.fill([size], ""), notes)

    def _constraints(self, constraints, size, tokenizer, limit, blank, warning):
        """(N,) constraints -> ((N, None, None) ragged phrase pieces, (N,) warnings with
        what was changed added): invalid UTF-8 replaced, phrases left out beyond `limit`
        (N,) pieces, a blank text's ignored; for a right-to-left model each phrase's
        pieces right to left, as it writes them."""
        given = steering.per_text(constraints, size, "constraints", tf.string)
        text = sanitize_utf8(given)
        phrases, cut = steering.constraint_pieces(tokenizer, text, limit)
        if self.reverse_target:  # the model writes each phrase's pieces right to left
            phrases = steering.reversed_phrases(phrases)
        has = phrases.row_lengths() > 0
        ignored = has & blank
        phrases = steering.keep_items(phrases, tf.repeat(~ignored, phrases.row_lengths()))
        pieces = steering.row_sums(phrases.values.row_lengths(), phrases.row_splits)
        notes = [(cut & ~ignored, tf.strings.join([
                     "constraints cut to ", tf.strings.as_string(pieces), " pieces (the output "
                     "limit less one: ", tf.strings.as_string(limit), "): phrases left out"])),
                 (tf.not_equal(text, given), "invalid UTF-8 in constraints replaced by "
                                             "U+FFFD"),
                 (has & blank, "blank text: constraints ignored")]
        return phrases, _with_notes(warning, notes)

    def _steered_search(self, source, first, steer, shortlist, token_scores=True):
        """Beam search of rows of one chunk of :meth:`nbest` with the Steering `steer` (its
        prefixes in vocabulary ids) -> (ids (R, beam, L) vocabulary ids, lengths, scores
        (R, beam)[, with `token_scores` token log-probabilities (R, beam, L)])."""
        if shortlist is not None:  # the search's columns (PAD is column 0 too)
            steer = steer._replace(prefix=_columns(shortlist, steer.prefix),
                                   constraints=_columns(shortlist, steer.constraints))
        out = beam_search(self.model, source, first["beam_size"], first["alpha"],
                          first["extra_length"], self.max_output_tokens, shortlist=shortlist,
                          stopping=self.options.stopping,
                          length_normalization=self.options.length_normalization,
                          steering=steer, token_log_probs=token_scores)
        if not token_scores:
            return out.ids, out.lengths, out.scores
        return out.ids, out.lengths, out.scores, out.token_log_probs

    def _first_pieces(self, source, prefix, lengths, ngram, penalty, k, shortlist):
        """The `k` most probable pieces after each prefix, EOS left out, by one
        teacher-forced decode, with the repetition controls (the prefix their history):
        ((R, k) vocabulary ids, most probable first; (R, k) bool usable)."""
        logits = next_logits(self.model, source, prefix, lengths)  # (R, V)
        history = prefix
        if shortlist is not None:
            logits, history = tf.gather(logits, shortlist, axis=1), _columns(shortlist, prefix)
        logits = steer_logits(logits, history, lengths, Steering(ngram, penalty, history,
                                                                 lengths))
        log_probs = next_token_log_probs(logits)
        vocab = tf.shape(log_probs)[1]
        log_probs = tf.where(tf.equal(tf.range(vocab), EOS_ID)[None, :], NEG_INF, log_probs)
        values, tokens = tf.math.top_k(log_probs, k=tf.minimum(k, vocab))
        if shortlist is not None:
            tokens = tf.gather(shortlist, tokens)
        pad = [[0, 0], [0, k - tf.shape(tokens)[1]]]
        return tf.pad(tokens, pad), tf.pad(values > NEG_INF / 2, pad)

    def score_pairs(self, text, target, target_language=None):
        """The graph behind the `score` signature: log P(target | text) of each pair by
        one teacher-forced decode (:func:`tfxformer.decoding.scoring.score_targets`).

        Both sides are read as `translate` reads a source: invalid UTF-8 replaced by
        U+FFFD, SentencePiece pieces, then EOS; the source is cut to `max_input_tokens`
        and the target to `max_output_tokens` tokens (EOS included: a cut target is scored
        without its EOS, as the prefix it is), either cut flagged in `truncated`. A blank
        side is EOS alone and is scored too (a pair with a blank side is exactly what
        corpus filtering wants a score for). Pairs are scored `max_batch_size` at a time
        in order of length; an empty batch gives empty outputs.

        Returns:
            {"log_prob": (N,) float32 log P(Y | X), "mean_log_prob": (N,) float32
            log P(Y | X) / length, "token_log_probs": (N, T) float32, 0 after `length`,
            "length": (N,) int32 target tokens scored (EOS included), "truncated": (N,)
            bool}.
        """
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        target = tf.reshape(tf.convert_to_tensor(target, tf.string), [-1])
        target = _checked(target, tf.equal(tf.size(target), tf.size(text)),
                          "`target` must have one value per text (shape [N] like `text`)")
        text, _ = self._with_language(text, target_language)
        tokenizer = self.make_tokenizer()
        source, source_cut, _ = self._cut(text, tokenizer, self._input_limit(text, None))
        limit = self.max_output_tokens
        target_ids, target_cut, _ = self._cut(target, tokenizer,
                                              tf.fill(tf.shape(target), limit + 1))
        target_cut |= target_ids.row_lengths() > limit  # the EOS itself did not fit
        if self.reverse_target:  # the pieces right to left, EOS still last
            target_ids = tf.concat([tf.reverse(target_ids[:, :-1], axis=[1]),
                                    target_ids[:, -1:]], axis=1)
        target_ids = target_ids[:, :limit]
        token_log_probs, lengths, log_probs = score_ragged(self.model, source, target_ids,
                                                          self.max_batch_size)
        return {"log_prob": log_probs,
                "mean_log_prob": log_probs / tf.cast(tf.maximum(lengths, 1), tf.float32),
                "token_log_probs": token_log_probs.to_tensor(0.0), "length": lengths,
                "truncated": source_cut | target_cut}

    def translate(self, text, beam_size=None, alpha=None, extra_length=None,
                  max_input_tokens=None, target_language=None, sampling=None):
        """The graph behind the signatures; options default to the constructor's.

        Options are Python numbers or scalar tensors (one value for the batch), or (N,)
        tensors (one per text: texts with equal options are decoded together).
        `target_language` ((N,) strings) is a multilingual model's, required there.
        `sampling`: None (beam search), or {sampling_topk, sampling_temperature,
        sampling_topp, seed} (scalars) to sample instead (then `beam_size` and `alpha`
        do not apply)."""
        text = tf.reshape(tf.convert_to_tensor(text, tf.string), [-1])
        text, tag_pieces = self._with_language(text, target_language)
        options = dict(
            beam_size=self.beam_size if beam_size is None else beam_size,
            alpha=self.alpha if alpha is None else alpha,
            extra_length=self.extra_length if extra_length is None else extra_length)
        if sampling is not None:
            options = dict(extra_length=options["extra_length"], **sampling)
        per_example = any(isinstance(v, tf.Tensor) and v.shape.rank == 1
                          for v in options.values())
        if per_example and sampling is not None:
            raise ValueError("Sampling takes scalar options (one value for the batch).")
        if per_example:
            options = self._example_options(text, options)
        tokenizer = self.make_tokenizer()
        pieces, truncated, blank = self._cut(text, tokenizer, self._input_limit(
            text, max_input_tokens), tag_pieces)
        # Blank inputs never reach the model: only the other rows are decoded.
        active = tf.where(~blank)[:, 0]
        rows = tf.gather(pieces, active)
        if per_example:
            options = {k: tf.gather(v, active) for k, v in options.items()}
            translations, scores = self._translate_groups(rows, options, tokenizer)
        else:
            translations, scores = self._translate_in_length_order(rows, options, tokenizer)
        index = tf.where(blank, tf.size(active, out_type=tf.int64),
                         tf.cumsum(tf.cast(~blank, tf.int64)) - 1)
        return {"translation": tf.gather(tf.concat([translations, [""]], 0), index),
                "score": tf.gather(tf.concat([scores, [0.0]], 0), index),
                "truncated": truncated}

    def _with_language(self, text, target_language):
        """(text, tag pieces): a multilingual model's texts tagged with their target
        language (:meth:`_tagged`), or the texts as given and None."""
        if self.target_languages:
            if target_language is None:
                raise ValueError("This model translates into "
                                 f"{_listed(self.target_languages)}: give `target_language`.")
            return self._tagged(text, target_language)
        if target_language is not None:
            raise ValueError("`target_language` is for a multilingual model; this one has one "
                             "target language.")
        return text, None

    def make_tokenizer(self):
        """The SentencePiece tokenizer, made inside the traced graph, so the SavedModel
        needs no resource object (:func:`tfxformer.data.tokenizer.sentencepiece_tokenizer`
        holds the one fix for tensorflow-text's kernel-owned resource)."""
        return sentencepiece_tokenizer(self.sentencepiece_model)

    def tokenize(self, text, tokenizer=None, max_input_tokens=None):
        """(N,) strings -> (N, None) ragged int32 source ids: pieces, cut, then EOS."""
        text = tf.convert_to_tensor(text, tf.string)
        limit = self._input_limit(text, max_input_tokens)
        return self._cut(text, tokenizer or self.make_tokenizer(), limit)[0]

    def detokenize(self, ids, lengths, tokenizer=None):
        """(B, L) ids with (B,) lengths counting a final EOS -> (B,) UTF-8 strings; a
        right-to-left model's pieces (`reverse_target`) put back in reading order first."""
        tokenizer = tokenizer or self.make_tokenizer()
        lengths = _without_eos(ids, lengths)
        if self.reverse_target:
            ids = tf.reverse_sequence(ids, lengths, seq_axis=1, batch_axis=0)
        text = tokenizer.detokenize(rows_to_ragged(ids, lengths))
        return sanitize_utf8(text)

    def _input_limit(self, text, max_input_tokens):
        """(N,) int32 source-token limits: the export's, or lower ones asked per text."""
        limit = tf.fill(tf.shape(text), self.max_input_tokens)
        if max_input_tokens is None:
            return limit
        asked = tf.cast(max_input_tokens, tf.int32)
        if asked.shape.rank == 1:
            asked = _checked(asked, tf.equal(tf.size(asked), tf.size(text)),
                             "`max_input_tokens` must have one value per text (shape [N] "
                             "like `text`)")
        asked = tf.broadcast_to(asked, tf.shape(text))
        asked = _checked(asked, tf.reduce_all(asked >= 1), "`max_input_tokens` must be >= 1")
        return tf.minimum(asked, limit)

    def _cut(self, text, tokenizer, limit, tag_pieces=None):
        """-> (pieces + EOS (N, None) ragged, truncated (N,) bool, blank (N,) bool); a
        text is blank when it has no piece beyond its `tag_pieces` ((N,) int32 or None)."""
        text = sanitize_utf8(text)
        chars = limit * _CHARS_PER_TOKEN
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

    def _example_options(self, text, options):
        """(N,) option tensors, checked: one per text, each in its accepted range."""
        size = tf.size(text)
        checks = {"beam_size": (tf.int32, lambda v: v >= 1, ">= 1"),
                  "alpha": (tf.float32, lambda v: v >= 0.0, ">= 0"),
                  "extra_length": (tf.int32, lambda v: v >= 0, ">= 0")}
        checked = {}
        for name, (dtype, valid, accepted) in checks.items():
            value = tf.cast(options[name], dtype)
            if value.shape.rank == 1:
                value = _checked(value, tf.equal(tf.size(value), size),
                                 f"`{name}` must have one value per text (shape [N] like "
                                 "`text`)")
            value = tf.broadcast_to(value, [size])
            checked[name] = _checked(value, tf.reduce_all(valid(value)),
                                     f"`{name}` must be {accepted} for every text")
        return checked

    def _translate_groups(self, pieces, options, tokenizer):
        """Per-text options: each group of texts with equal options is decoded on its own."""
        keys = tf.stack([options["beam_size"], tf.bitcast(options["alpha"], tf.int32),
                         options["extra_length"]], axis=1)  # (N, 3)
        unique = tf.raw_ops.UniqueV2(x=keys, axis=tf.constant([0], tf.int64))
        groups = tf.shape(unique.y)[0]

        def body(g, members, translations, scores):
            rows = tf.where(tf.equal(unique.idx, g))[:, 0]
            first = {k: v[rows[0]] for k, v in options.items()}
            text, score = self._translate_in_length_order(tf.gather(pieces, rows), first,
                                                          tokenizer)
            return (g + 1, members.write(g, rows), translations.write(g, text),
                    scores.write(g, score))

        arrays = [tf.TensorArray(dtype, size=groups, infer_shape=False, element_shape=[None])
                  for dtype in (tf.int64, tf.string, tf.float32)]
        _, *arrays = tf.while_loop(lambda g, *_: g < groups, body, [tf.constant(0), *arrays])
        empty = tf.equal(groups, 0)
        members, translations, scores = (
            _concat(a, empty, d) for a, d in zip(arrays, (tf.int64, tf.string, tf.float32),
                                                 strict=True))
        inverse = tf.math.invert_permutation(members)
        return tf.gather(translations, inverse), tf.gather(scores, inverse)

    def _translate_in_length_order(self, pieces, options, tokenizer):
        """Sorts rows by length, translates them in chunks, returns them in row order."""
        order = tf.argsort(pieces.row_lengths(), direction="DESCENDING", stable=True)
        translations, scores = self._translate_sorted(tf.gather(pieces, order), options,
                                                      tokenizer)
        inverse = tf.math.invert_permutation(order)
        return tf.gather(translations, inverse), tf.gather(scores, inverse)

    def _translate_sorted(self, pieces, options, tokenizer):
        """Translates chunks of `max_batch_size` rows of `pieces` in a tf.while_loop."""
        total = pieces.nrows(out_type=tf.int32)
        size = self.max_batch_size
        chunks = (total + size - 1) // size

        def body(c, translations, scores):
            source = pieces[c * size:tf.minimum((c + 1) * size, total)].to_tensor()
            shortlist = None
            if self.shortlist_info is not None:
                shortlist = shortlist_ids(source, self.shortlist_table,
                                          self.shortlist_frequent)
            ids, lengths, score = self._search(source, options, shortlist, c)
            text = self.detokenize(ids, lengths, tokenizer)
            return c + 1, translations.write(c, text), scores.write(c, score)

        arrays = [tf.TensorArray(dtype, size=chunks, infer_shape=False, element_shape=[None])
                  for dtype in (tf.string, tf.float32)]
        _, translations, scores = tf.while_loop(
            lambda c, *_: c < chunks, body, [tf.constant(0), *arrays])
        empty = tf.equal(total, 0)
        return _concat(translations, empty, tf.string), _concat(scores, empty, tf.float32)

    @functools.cached_property
    def _best_of_beam(self):
        """(source (B, S), beam size, α, extra length[, shortlist]) -> the best (ids (B, L),
        lengths (B,), scores (B,)) by beam search: one `tf.function` that the signatures
        with option inputs call, so an export traces it and holds its graph once (once
        more with a shortlist), not once per signature; serving_default runs its
        `python_function` in its own graph, with the export's options as constants."""
        def best(source, beam_size, alpha, extra_length, shortlist=None):
            out = beam_search(self.model, source, beam_size, alpha, extra_length,
                              self.max_output_tokens, shortlist=shortlist,
                              stopping=self.options.stopping,
                              length_normalization=self.options.length_normalization)
            return out.ids[:, 0], out.lengths[:, 0], out.scores[:, 0]

        return tf.function(best, autograph=False)

    def _search(self, source, options, shortlist, chunk):
        """The best (ids (B, L), lengths (B,), scores (B,)) of one chunk: beam search, or
        sampling when `options` holds a seed (chunk c draws with fold_in(seed, c))."""
        limits = dict(max_output_length=self.max_output_tokens, shortlist=shortlist)
        if "seed" in options:
            key = fold_seed(seed_key(options["seed"]), chunk)
            out = greedy_decode(self.model, source, **{**options, "seed": key}, **limits)
            return out.ids, out.lengths, out.scores

        def graph():
            names = ("beam_size", "alpha", "extra_length")
            if not any(isinstance(options[name], tf.Tensor) for name in names):
                # serving_default's: a beam size known when tracing gives static shapes
                return self._best_of_beam.python_function(source, *(options[n] for n in names),
                                                          shortlist)
            values = [tf.cast(options[name], dtype) for name, dtype in zip(
                names, (tf.int32, tf.float32, tf.int32), strict=True)]
            if shortlist is None:  # translate_with_options' and translate_per_example's
                return self._best_of_beam(source, *values)
            return self._best_of_beam(source, *values, shortlist)

        if self.compiled_search is None or shortlist is not None:
            return graph()
        return self.compiled_search.or_else(source, options, graph)


def _without_eos(ids, lengths):
    """(B,) the lengths of the (B, L) `ids` rows without a final EOS."""
    last = tf.gather(ids, tf.maximum(lengths - 1, 0), batch_dims=1)
    return lengths - tf.cast((lengths > 0) & tf.equal(last, EOS_ID), lengths.dtype)


def _with_notes(warning, notes):
    """(N,) warnings with each (where (N,) bool, note) pair's note added where it holds."""
    for where, note in notes:
        joined = tf.strings.join([warning, tf.where(tf.equal(warning, ""), "", "; "), note])
        warning = tf.where(where, joined, warning)
    return warning


def _columns(shortlist, ids):
    """Vocabulary ids (any shape) in the shortlist -> its columns."""
    columns = tf.searchsorted(shortlist[None, :], tf.reshape(ids, [1, -1]))
    return tf.reshape(columns, tf.shape(ids))


def _listed(languages):
    return ", ".join(repr(language) for language in languages)


class MultilingualTranslator(Translator):
    """A :class:`Translator` for one model of several target languages (Johnson et al.,
    2017; :mod:`tfxformer.multilingual`): every signature takes, after `text`, a
    `target_language` input ((N,) tf.string, one of `target_languages` per text), and the
    graph puts that language's tag before each text, as the training data had it. The
    tag's pieces count towards `max_input_tokens`. A language the model does not know
    fails the call (InvalidArgumentError naming it and the accepted ones).

    Signatures: `serving_default(text, target_language)`,
    `translate_with_options(text, target_language, beam_size, alpha, extra_length)`,
    `translate_per_example(text, target_language, beam_size, alpha, extra_length,
    max_input_tokens)`, `translate_sampled(text, target_language, sampling_topk,
    sampling_temperature, sampling_topp, extra_length, seed)`, `translate_nbest(text,
    target_language, beam_size, alpha, extra_length, max_input_tokens, num_hypotheses,
    no_repeat_ngram_size, repetition_penalty, target_prefix, constraints)`,
    `score(text, target_language, target)` (the tag goes before `text`, the source);
    outputs as :class:`Translator`'s.

    Example:
    >>> translator = MultilingualTranslator(model, spm_bytes, ("de", "fr"))
    >>> translator(tf.constant(["A dog runs."] * 2), tf.constant(["de", "fr"]))
    """

    def __init__(self, model, sentencepiece_model: bytes, target_languages, **options):
        super().__init__(model, sentencepiece_model, **options)
        self.target_languages = multilingual.parse_languages(target_languages)
        self._tags = [multilingual.tag_source(language, "") for language in
                      self.target_languages]
        self._tag_pieces = [multilingual.tag_pieces(sentencepiece_model, language)
                            for language in self.target_languages]

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC)
    def __call__(self, text, target_language):
        return self.translate(text, target_language=target_language)

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC, *_OPTION_SPECS)
    def translate_with_options(self, text, target_language, beam_size, alpha, extra_length):
        return self.translate(text, beam_size, alpha, extra_length,
                              target_language=target_language)

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC, *_EXAMPLE_OPTION_SPECS)
    def translate_per_example(self, text, target_language, beam_size, alpha, extra_length,
                              max_input_tokens):
        return self.translate(text, beam_size, alpha, extra_length, max_input_tokens,
                              target_language=target_language)

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC, *_SAMPLING_SPECS)
    def translate_sampled(self, text, target_language, sampling_topk, sampling_temperature,
                          sampling_topp, extra_length, seed):
        return self.translate(text, extra_length=extra_length, target_language=target_language,
                              sampling=dict(sampling_topk=sampling_topk,
                                            sampling_temperature=sampling_temperature,
                                            sampling_topp=sampling_topp, seed=seed))

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC, *steering.NBEST_SPECS)
    def translate_nbest(self, text, target_language, beam_size, alpha, extra_length,
                        max_input_tokens, num_hypotheses, no_repeat_ngram_size,
                        repetition_penalty, target_prefix, constraints):
        return self.nbest(text, beam_size, alpha, extra_length, max_input_tokens,
                          num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                          target_prefix, constraints, target_language=target_language)

    @_signature(_TEXT_SPEC, _LANGUAGE_SPEC, _TARGET_SPEC)
    def score(self, text, target_language, target):
        return self.score_pairs(text, target, target_language)

    def _tagged(self, text, target_language):
        """(N,) texts with their language's tag in front, and (N,) int32 the tag's pieces;
        fails unless there is one known language per text."""
        language = tf.reshape(tf.convert_to_tensor(target_language, tf.string), [-1])
        language = _checked(language, tf.equal(tf.size(language), tf.size(text)),
                            "`target_language` must have one value per text (shape [N] like "
                            "`text`)")
        match = tf.equal(language[:, None], tf.constant(self.target_languages)[None, :])
        known = tf.reduce_any(match, axis=1)
        check = tf.debugging.Assert(tf.reduce_all(known), [
            f"`target_language` must be one of {', '.join(self.target_languages)}; got",
            tf.boolean_mask(language, ~known)])
        with tf.control_dependencies([check]):
            index = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int32)
        tags = tf.gather(tf.constant(self._tags), index)
        return (tf.strings.join([tags, text]),
                tf.gather(tf.constant(self._tag_pieces, tf.int32), index))
