"""Beam search compiled with XLA for the small chunks of a translator (one sentence at a time).

A chunk of one sentence runs ~15 decoder steps of ~400 tiny ops each; run op by op in
TensorFlow's graph executor, a step costs the executor's fixed cost per op (a few µs)
hundreds of times, far more than its arithmetic at d_model 128 (bench/README.md, "One
sentence at a time"). XLA:CPU compiles the whole search (encoder, the `tf.while_loop` of
decoder steps with a static cache, the top-k) into one program, which removes most of
that cost. XLA needs fixed shapes, and compiles a program per input shape: so a chunk's
sources are padded to a *bucket* (rows repeated up to 1, 2, 4, ... sentences; PAD columns
up to 16, 32, 64, ... tokens), and a stream of sentences of any length runs a bounded
number of programs (:func:`buckets`), each compiled on first use (the export's warm-up
records compile the common ones: :func:`tfxformer.serving.warmup.warmup_requests`).

Padding changes nothing a sentence sees: padded source columns are masked out of every
attention, and the padded rows are copies of the first sentence whose outputs are
dropped. The search is :func:`tfxformer.decoding.beam_search` with `static_cache=True`
(the same search; its n-best lists are held from the step a sentence is done), so the
translations are those of the graph path up to float rounding of another operation
order (tests/test_compiled_search.py; bench/README.md for the share on test_2016).

A chunk's vocabulary shortlist (an export with `--shortlist K,N`) is an input of the
program too, padded to a *shortlist bucket* (:func:`shortlist_buckets`: 256, 384, 512,
768, 1024, ... up to the vocabulary) with ids the search never generates (their logits
are -inf before the softmax: :func:`tfxformer.decoding.shortlist.pad_shortlist`), so the
output is the graph path's over the same shortlist; the output projection, log-softmax and
top-k then run over the bucket's columns instead of the whole vocabulary.

Batches above `max_batch` go the graph path (a growing cache that finished sentences
leave, which is faster at batch 64), and so do options the compiled program does not take
as inputs: a beam size or extra length other than the export's, and sampling. The length
penalty α is an input (one program for every α).

TF Serving runs these programs only when started with `--xla_cpu_compilation_enabled=true`
(`tensorflow_model_server` disables XLA:CPU otherwise, and the version fails to load on
its warm-up records); exports made with `--no-xla` need no flag.

Shapes: B sentences of a chunk, B̂ its batch bucket, S source length, Ŝ its length
bucket, L output columns, C shortlist length, Ĉ its shortlist bucket, V vocabulary.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding import beam_search
from tfxformer.decoding.shortlist import pad_shortlist

# Sentences per chunk compiled by default: none. At batch 1 XLA removes most of the step's
# cost (by batch 64 the graph path is faster: finished sentences leave its batch), but the
# compiled programs take minutes to build when a version loads, hold more memory, and
# stock tensorflow_model_server runs them only with --xla_cpu_compilation_enabled=true:
# an export for interactive serving asks for them (--xla-max-batch 1).
DEFAULT_MAX_BATCH = 0
_SMALLEST_LENGTH_BUCKET = 16
_SMALLEST_SHORTLIST_BUCKET = 256


def buckets(limit, smallest=1):
    """Powers of two from `smallest` up to the first >= `limit`, the last cut to `limit`:
    buckets(128, 16) = (16, 32, 64, 128); buckets(100, 16) = (16, 32, 64, 100)."""
    limit = checks.integer(limit, "limit", 1)
    sizes, size = [], min(checks.integer(smallest, "smallest", 1), limit)
    while size < limit:
        sizes.append(size)
        size *= 2
    return tuple(sizes + [limit])


def shortlist_buckets(vocab_size):
    """The shortlist lengths compiled for a vocabulary of `vocab_size`: powers of two from
    256 and 1.5 times them below it, then `vocab_size` (a shortlist of N frequent ids plus
    a sentence's own is a little over a power of two when N is one: the half steps keep its
    padding under a third): shortlist_buckets(1000) = (256, 384, 512, 768, 1000)."""
    sizes = [size for low in buckets(vocab_size, _SMALLEST_SHORTLIST_BUCKET)[:-1]
             for size in (low, low * 3 // 2) if size < vocab_size]
    return tuple(sizes + [vocab_size])


class CompiledSearch:
    """The XLA-compiled beam search of a translator's small chunks.

    Args:
        model: the translator's model (a :class:`tfxformer.Transformer` or an ensemble list).
        beam_size, extra_length, max_output_tokens, stopping, length_normalization: the
            translator's defaults, fixed in the compiled program.
        max_input_tokens: the longest source, EOS included (the last length bucket).
        max_batch: the largest chunk compiled (>= 1); larger ones go the graph path.
        vocab_size: V when every chunk comes with a vocabulary shortlist (an export's
            shortlist table), compiled per shortlist bucket; None without one.

    `applies(source, options)` is the scalar bool tensor saying whether a chunk goes this
    way; `search(source, alpha, shortlist)` returns the best hypothesis of each sentence:
    (ids (B, L) int32, lengths (B,) int32, scores (B,) float32), as the graph path.
    """

    def __init__(self, model, beam_size, extra_length, max_output_tokens, max_input_tokens,
                 stopping, length_normalization, max_batch=DEFAULT_MAX_BATCH,
                 vocab_size=None):
        self.model = model
        self.beam_size = checks.integer(beam_size, "beam_size", 1)
        self.extra_length = checks.integer(extra_length, "extra_length", 0)
        self.max_output_tokens = max_output_tokens
        self.stopping, self.length_normalization = stopping, length_normalization
        self.max_batch = checks.integer(max_batch, "max_batch", 1)
        self.batch_buckets = buckets(self.max_batch)
        self.length_buckets = buckets(max_input_tokens, _SMALLEST_LENGTH_BUCKET)
        self.vocab_size = None if vocab_size is None else checks.integer(vocab_size,
                                                                          "vocab_size", 1)
        self.shortlist_buckets = () if vocab_size is None else shortlist_buckets(vocab_size)
        self._compiled = tf.function(self._search, jit_compile=True, autograph=False)

    @property
    def programs(self):
        """The number of programs a stream of chunks may compile: batch x length buckets
        (x shortlist buckets with a shortlist; for --xla-max-batch 1, max_input_tokens 128
        and 8,000 pieces: 1 x 4 x 11 = 44, a lone sentence of one length using one or two
        of its length's 11)."""
        return (len(self.batch_buckets) * len(self.length_buckets)
                * max(1, len(self.shortlist_buckets)))

    def applies(self, source, options):
        """() bool: `source` (B, S) has at most `max_batch` rows and `options` (beam_size,
        extra_length: Python ints or scalar tensors) are the compiled program's."""
        ok = tf.shape(source)[0] <= self.max_batch
        for name in ("beam_size", "extra_length"):
            value = options[name]
            if tf.is_tensor(value):
                ok &= tf.equal(tf.cast(value, tf.int32), getattr(self, name))
            elif value != getattr(self, name):
                return tf.constant(False)
        return ok

    def or_else(self, source, options, graph, shortlist=None):
        """`search(source, options["alpha"], shortlist)` where :meth:`applies`, else
        `graph()` (the graph path's (ids, lengths, scores)), chosen in the graph
        (`tf.cond`)."""
        applies = self.applies(source, options)
        if tf.get_static_value(applies) is False:
            return graph()
        return tf.cond(applies, lambda: self.search(source, options["alpha"], shortlist),
                       graph)

    def search(self, source, alpha, shortlist=None):
        """The best hypotheses of `source` (B, S) (B <= max_batch), padded to its bucket,
        over its (C,) `shortlist` (None: the whole vocabulary) padded to its bucket."""
        batch, length = tf.shape(source)[0], tf.shape(source)[1]
        padded_batch = _bucket(batch, self.batch_buckets)
        padded_length = _bucket(length, self.length_buckets)
        rows = tf.concat([tf.range(batch), tf.zeros([padded_batch - batch], tf.int32)], 0)
        padded = tf.pad(tf.gather(tf.cast(source, tf.int32), rows),
                        [[0, 0], [0, padded_length - length]])
        alpha = tf.cast(alpha, tf.float32)
        if shortlist is None:
            ids, lengths, scores = self._compiled(padded, alpha)
        else:
            if self.vocab_size is None:
                raise ValueError("A shortlist needs the CompiledSearch's `vocab_size`.")
            size = _bucket(tf.size(shortlist), self.shortlist_buckets)
            ids, lengths, scores = self._compiled(
                padded, alpha, *pad_shortlist(shortlist, size, self.vocab_size))
        return ids[:batch], lengths[:batch], scores[:batch]

    def _search(self, source, alpha, shortlist=None, usable=None):
        out = beam_search(self.model, source, self.beam_size, alpha, self.extra_length,
                          self.max_output_tokens, static_cache=True, stopping=self.stopping,
                          length_normalization=self.length_normalization,
                          shortlist=shortlist, shortlist_mask=usable)
        return out.ids[:, 0], out.lengths[:, 0], out.scores[:, 0]


def _bucket(size, sizes):
    """() int32: the smallest of `sizes` (ascending) >= `size` (<= the last)."""
    table = tf.constant(sizes, tf.int32)
    return tf.gather(table, tf.minimum(tf.searchsorted(table, [size])[0], len(sizes) - 1))
