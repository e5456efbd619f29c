"""Which search decodes a translator's chunk: sampling, the XLA-compiled beam search or the
graph's beam search, chosen here and nowhere else.

:meth:`Search.best` gives the best hypothesis of each sentence of a chunk: sampled
(:func:`tfxformer.decoding.greedy_decode`) when the options hold a seed; else by the
compiled search (:mod:`tfxformer.serving.compiled`) where it applies (a small chunk, the
export's beam size and extra length; over the chunk's shortlist, if the export has one),
chosen in the graph; else by the graph's beam search
(:func:`tfxformer.decoding.beam_search`). :meth:`Search.steered` is the beam search
of `translate_nbest` (repetition controls, prefixes, constraints),
:meth:`Search.first_pieces` the pieces most probable after a prefix.

Shapes: B sentences of a chunk, S source length, L output columns, R rows, V vocabulary.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding import beam_search, greedy_decode
from tfxformer.decoding.common import NEG_INF, next_token_log_probs
from tfxformer.decoding.sampling import fold_seed, seed_key
from tfxformer.decoding.scoring import next_logits
from tfxformer.decoding.shortlist import shortlist_ids
from tfxformer.decoding.steering import Steering, steer_logits
from tfxformer.ids import EOS_ID
from tfxformer.serving.compiled import CompiledSearch

__all__ = ["Search"]

_OPTION_DTYPES = {"beam_size": tf.int32, "alpha": tf.float32, "extra_length": tf.int32}


def _columns(shortlist, ids):
    """Vocabulary ids (any shape) in the shortlist -> its columns."""
    columns = tf.searchsorted(shortlist[None, :], tf.reshape(ids, [1, -1]))
    return tf.reshape(columns, tf.shape(ids))


class Search:
    """A translator's searches (module docstring).

    Args:
        model: a :class:`tfxformer.Transformer`, or a list of them (an ensemble).
        options: the translator's :class:`tfxformer.config.DecodingOptions`: its beam
            size, extra length, limits, stopping rule and length normalization.
        shortlist: None, or the shortlist's (table (V, K), frequent (N,)) tf.Variables.
        xla_max_batch: chunks of at most this many sentences run the compiled search
            (0: never).
    """

    def __init__(self, model, options, shortlist=None, xla_max_batch=0):
        self.model, self.options, self.shortlist_variables = model, options, shortlist
        self.xla_max_batch = checks.integer(xla_max_batch, "xla_max_batch", 0)
        self.compiled_search = None if not self.xla_max_batch else CompiledSearch(
            model, options.beam_size, options.extra_length, options.max_output_tokens,
            options.max_input_tokens, options.stopping, options.length_normalization,
            self.xla_max_batch, None if shortlist is None else int(shortlist[0].shape[0]))

    def shortlist(self, source, forced=None):
        """(C,) int32 the shortlist of the chunk `source` (B, S) (the table rows of its
        tokens, the frequent ids and the (M,) ids `forced`), or None without one."""
        if self.shortlist_variables is None:
            return None
        table, frequent = self.shortlist_variables
        if forced is not None:
            frequent = tf.concat([frequent, forced], axis=0)
        return shortlist_ids(source, table, frequent)

    def best(self, source, options, shortlist, chunk):
        """The best (ids (B, L), lengths (B,), scores (B,)) of one chunk: sampling when
        `options` holds a seed (chunk `chunk` draws with fold_in(seed, chunk)), else beam
        search with `options` (beam_size, alpha, extra_length: Python numbers, or ()
        tensors)."""
        limits = dict(max_output_length=self.options.max_output_tokens, shortlist=shortlist)
        if "seed" in options:
            key = fold_seed(seed_key(options["seed"]), chunk)
            out = greedy_decode(self.model, source, **{**options, "seed": key}, **limits)
            return out.ids, out.lengths, out.scores

        def graph():
            if not any(isinstance(options[name], tf.Tensor) for name in _OPTION_DTYPES):
                # serving_default's: a beam size known when tracing gives static shapes
                return self.best_of_beam.python_function(
                    source, *(options[name] for name in _OPTION_DTYPES), shortlist)
            values = [tf.cast(options[name], dtype) for name, dtype in _OPTION_DTYPES.items()]
            if shortlist is None:  # translate_with_options' and translate_per_example's
                return self.best_of_beam(source, *values)
            return self.best_of_beam(source, *values, shortlist)

        if self.compiled_search is None:
            return graph()
        return self.compiled_search.or_else(source, options, graph, shortlist)

    @functools.cached_property
    def best_of_beam(self):
        """(source (B, S), beam size, α, extra length[, shortlist]) -> the best (ids (B, L),
        lengths (B,), scores (B,)) by beam search: one `tf.function` that the signatures
        with option inputs call, so an export traces it and holds its graph once (once
        more with a shortlist), not once per signature; serving_default runs its
        `python_function` in its own graph, with the export's options as constants."""
        def best(source, beam_size, alpha, extra_length, shortlist=None):
            out = beam_search(self.model, source, beam_size, alpha, extra_length,
                              self.options.max_output_tokens, shortlist=shortlist,
                              stopping=self.options.stopping,
                              length_normalization=self.options.length_normalization)
            return out.ids[:, 0], out.lengths[:, 0], out.scores[:, 0]

        return tf.function(best, autograph=False)

    def steered(self, source, options, steering, shortlist, token_scores=True):
        """Beam search of rows of one chunk with the Steering `steering` (its prefixes
        and constraints in vocabulary ids) and `options` (() beam_size, alpha,
        extra_length) -> (ids (R, beam, L) vocabulary ids, lengths, scores (R, beam)[,
        with `token_scores` token log-probabilities (R, beam, L)])."""
        if shortlist is not None:  # the search's columns (PAD is column 0 too)
            steering = steering._replace(prefix=_columns(shortlist, steering.prefix),
                                         constraints=_columns(shortlist, steering.constraints))
        out = beam_search(self.model, source, options["beam_size"], options["alpha"],
                          options["extra_length"], self.options.max_output_tokens,
                          shortlist=shortlist, stopping=self.options.stopping,
                          length_normalization=self.options.length_normalization,
                          steering=steering, token_log_probs=token_scores)
        if not token_scores:
            return out.ids, out.lengths, out.scores
        return out.ids, out.lengths, out.scores, out.token_log_probs

    def first_pieces(self, source, prefix, lengths, ngram, penalty, k, shortlist):
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
