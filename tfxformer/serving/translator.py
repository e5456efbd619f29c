"""String-to-string translation in one TensorFlow graph (§6.1 decoding), ready to export.

Shapes: N input strings, B sentences of one chunk, S source length, K beam size.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfxformer import checks
from tfxformer.config import DecodingOptions
from tfxformer.decoding import model_calls
from tfxformer.decoding.chunking import decode_in_chunks
from tfxformer.decoding.ensemble import check_members, members
from tfxformer.decoding.scoring import score_ragged
from tfxformer.decoding.shortlist import check_table
from tfxformer.serving import search
from tfxformer.serving.alignment import restore_markup
from tfxformer.serving.inputs import (
    EXAMPLE_OPTION_SPECS,
    OPTION_SPECS,
    SAMPLING_SPECS,
    TARGET_SPEC,
    TEXT_SPEC,
    checked,
    example_options,
    input_limits,
    option_keys,
)
from tfxformer.serving.nbest_lists import translate_nbest
from tfxformer.serving.nbest_request import NBEST_SPECS
from tfxformer.serving.reading import RAW
from tfxformer.serving.text import TextCodec

__all__ = ["Translator", "signature"]


def signature(*specs):
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


def _as_variables(tensors):
    """A structure of tensors (None kept) as non-trainable tf.Variables."""
    return tf.nest.map_structure(
        lambda t: None if t is None else tf.Variable(t, trainable=False), tensors)


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
        alignment_layer: the decoder layer whose encoder–decoder attention gives
            `translate_nbest`'s word alignments (negative: from the top); None (default):
            the model's own (`ModelConfig.alignment_layer` and `alignment_heads`: the
            penultimate layer, or a guided-alignment model's supervised head;
            :mod:`tfxformer.serving.alignment`).
        markup: a text with inline markup (tags, entities, placeholders) is translated
            without it and gets it back around the aligned words
            (:mod:`tfxformer.serving.markup`, docs/markup.md); False reads it as text.
        reading: :class:`tfxformer.serving.reading.ReadingOptions` (None: sentences split
            by generic rules, recased): how every signature but `score` reads a text.

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
                 length_normalization=None, reverse_target=False, xla_max_batch=0,
                 reading=None, alignment_layer=None, markup=True):
        super().__init__(name=name)
        self.alignment_layer = checks.integer(alignment_layer, "alignment_layer",
                                              allow_none=True)
        self.codec = TextCodec(sentencepiece_model, reverse_target, reading=reading,
                               markup=markup)
        self.reading = self.codec.reading
        self.reverse_target = self.codec.reverse_target
        models = members(model)
        positions = check_members(models)
        for member in models:
            if not member.built:
                member.build()
        self.models = models  # tracked: every member's variables are the module's
        # Each member's encoder and decoder functions, traced once for all the signatures.
        self.__dict__["_shared_functions"] = {}  # untracked: holds the models again
        # What each member's search step would derive from its variables at every call
        # (the embedding transposed for the output projection, ...), kept as variables.
        self.derived_weights = [_as_variables(member.search_step_weights())
                                for member in models]
        for member, derived in zip(models, self.derived_weights, strict=True):
            if derived is not None:
                model_calls.keep_derived_weights(self._shared_functions, member, derived)
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
        self.shortlist_info = None
        if shortlist is not None:
            table = check_table(shortlist, int(models[0].model_config.vocab_size))
            self.shortlist_info = dict(table.info, table_shape=list(table.table.shape),
                                       frequent_ids=int(table.frequent.size))
            self.shortlist_table = tf.Variable(table.table, trainable=False,
                                               name="shortlist_table")
            self.shortlist_frequent = tf.Variable(table.frequent, trainable=False,
                                                  name="shortlist_frequent")
        # Which search decodes a chunk (sampling, XLA-compiled or graph beam search).
        self.search = search.Search(self.model, self.options, self.shortlist_variables or None,
                                    xla_max_batch)

    @property
    def shortlist_variables(self):
        """The shortlist's (table, frequent) tf.Variables, or () without a shortlist."""
        if self.shortlist_info is None:
            return ()
        return (self.shortlist_table, self.shortlist_frequent)

    @property
    def xla_max_batch(self):
        """Chunks of at most this many sentences run the XLA-compiled search (0: none)."""
        return self.search.xla_max_batch

    @property
    def compiled_search(self):
        """The XLA-compiled search (:class:`tfxformer.serving.compiled.CompiledSearch`), or
        None without one (`xla_max_batch` 0)."""
        return self.search.compiled_search

    @property
    def max_input_length(self):
        """Former name of `max_input_tokens`."""
        return self.max_input_tokens

    @signature(TEXT_SPEC)
    def __call__(self, text):
        return self.translate(text)

    @signature(TEXT_SPEC, *OPTION_SPECS)
    def translate_with_options(self, text, beam_size, alpha, extra_length):
        return self.translate(text, beam_size, alpha, extra_length)

    @signature(TEXT_SPEC, *EXAMPLE_OPTION_SPECS)
    def translate_per_example(self, text, beam_size, alpha, extra_length, max_input_tokens):
        return self.translate(text, beam_size, alpha, extra_length, max_input_tokens)

    @signature(TEXT_SPEC, *SAMPLING_SPECS)
    def translate_sampled(self, text, sampling_topk, sampling_temperature, sampling_topp,
                          extra_length, seed):
        return self.translate(text, extra_length=extra_length, sampling=dict(
            sampling_topk=sampling_topk, sampling_temperature=sampling_temperature,
            sampling_topp=sampling_topp, seed=seed))

    @signature(TEXT_SPEC, *NBEST_SPECS)
    def translate_nbest(self, text, beam_size, alpha, extra_length, max_input_tokens,
                        num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                        target_prefix, constraints):
        return self.nbest(text, beam_size, alpha, extra_length, max_input_tokens,
                          num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                          target_prefix, constraints)

    @signature(TEXT_SPEC, TARGET_SPEC)
    def score(self, text, target):
        return self.score_pairs(text, target)

    def nbest(self, text, beam_size, alpha, extra_length, max_input_tokens, num_hypotheses,
              no_repeat_ngram_size=0, repetition_penalty=1.0, target_prefix="",
              constraints="", target_language=None, token_scores=True):
        """The graph behind `translate_nbest`: each text's `num_hypotheses` best
        translations (:func:`tfxformer.serving.nbest_lists.translate_nbest`)."""
        return translate_nbest(self, text, beam_size, alpha, extra_length, max_input_tokens,
                               num_hypotheses, no_repeat_ngram_size, repetition_penalty,
                               target_prefix, constraints, target_language, token_scores)

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
        target = checked(target, tf.equal(tf.size(target), tf.size(text)),
                         "`target` must have one value per text (shape [N] like `text`)")
        tokenizer = self.make_tokenizer()
        source = self.codec.to_source(text, self._input_limits(None, tf.size(text)),
                                      target_language, tokenizer, reading=RAW)
        markup = self.codec.take_out(target)  # a target is read as its source is
        target = target if markup is None else markup.plain
        target_ids, target_cut = self.codec.to_target(target, self.max_output_tokens,
                                                      tokenizer)
        token_log_probs, lengths, log_probs = score_ragged(self.model, source.pieces,
                                                          target_ids, self.max_batch_size)
        return {"log_prob": log_probs,
                "mean_log_prob": log_probs / tf.cast(tf.maximum(lengths, 1), tf.float32),
                "token_log_probs": token_log_probs.to_tensor(0.0), "length": lengths,
                "truncated": source.truncated | target_cut}

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
        tokenizer = self.make_tokenizer()
        source = self.read(text, self._input_limits(max_input_tokens, tf.size(text)),
                           target_language)
        if per_example:
            options = example_options(options, tf.size(text))
        # Blank rows never reach the model: only the other rows are decoded.
        active = source.decoded_rows()
        pieces = tf.gather(source.pieces, active)
        keys = None
        if per_example:  # rows with equal options are decoded together
            options = {name: tf.gather(source.rows.per_row(value), active)
                       for name, value in options.items()}
            keys = option_keys(options)

        def decode(rows, chunk):
            source_ids = tf.gather(pieces, rows).to_tensor()  # (B, S)
            chunk_options = options if keys is None else {
                name: value[rows[0]] for name, value in options.items()}
            ids, lengths, scores = self.search.best(source_ids, chunk_options,
                                                    self.search.shortlist(source_ids), chunk)
            return self.codec.to_text(ids, lengths, tokenizer), scores

        translations, scores = decode_in_chunks(
            tf.cast(pieces.row_lengths(), tf.int32), self.max_batch_size, decode,
            (tf.string, tf.float32), keys=keys)
        return {"translation": self.write(source, source.restore(translations, ""),
                                          target_language),
                "score": source.rows.sum(source.restore(scores, 0.0), 0.0),
                "truncated": source.text_truncated()}

    def read(self, text, limits, target_language=None):
        """(N,) texts -> their :class:`tfxformer.serving.text.Source`, read by the codec
        (:meth:`tfxformer.serving.text.TextCodec.to_source`) with `limits` (N,) int32
        tokens; in an export, one function that every signature calls."""
        return self._shared("read", self._read)(text, limits, target_language)

    def write(self, source, translations, target_language=None):
        """The (S,) rows' best `translations` of `source` -> the (N,) texts' translations:
        cleaned, cased and joined (:meth:`tfxformer.serving.text.Source.to_texts`), the
        inline markup put back at the aligned words
        (:func:`tfxformer.serving.alignment.restore_markup`); in an export, one function
        that the translating signatures call."""
        return self._shared("write", self._write)(source, translations, target_language)

    def _read(self, text, limits, target_language):
        return self.codec.to_source(text, limits, target_language,
                                    tokenizer=self.make_tokenizer())

    def _write(self, source, translations, target_language):
        translations = source.rows.clean(translations, source.unknown)
        texts = source.rows.join(translations)  # Source.to_texts of the cleaned rows
        return restore_markup(self, source, texts, translations, self.make_tokenizer(),
                              target_language)

    def _shared(self, name, function):
        """`function`, or while an export traces its signatures the one `tf.function` of
        it that they all call (:func:`tfxformer.decoding.model_calls.shared`)."""
        return model_calls.shared(self, name, function) or function

    def _input_limits(self, max_input_tokens, size):
        """(N,) int32 source-token limits: the export's, or lower ones asked per text."""
        return input_limits(max_input_tokens, size, self.max_input_tokens)

    def make_tokenizer(self):
        """The SentencePiece tokenizer, made inside the traced graph
        (:meth:`tfxformer.serving.text.TextCodec.tokenizer`)."""
        return self.codec.tokenizer()

    def tokenize(self, text, tokenizer=None, max_input_tokens=None):
        """(N,) strings -> (N, None) ragged int32 source ids: pieces, cut, then EOS."""
        text = tf.convert_to_tensor(text, tf.string)
        limits = self._input_limits(max_input_tokens, tf.size(text))
        return self.codec.cut(text, tokenizer or self.make_tokenizer(), limits)[0]

    def detokenize(self, ids, lengths, tokenizer=None):
        """(B, L) ids with (B,) lengths counting a final EOS -> (B,) UTF-8 strings; a
        right-to-left model's pieces (`reverse_target`) put back in reading order first
        (:meth:`tfxformer.serving.text.TextCodec.to_text`)."""
        return self.codec.to_text(ids, lengths, tokenizer)
