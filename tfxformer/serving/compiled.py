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

Batches above `max_batch` go the graph path (a growing cache that finished sentences
leave, which is faster at batch 64), and so do options the compiled program does not take
as inputs: a beam size or extra length other than the export's, sampling, a vocabulary
shortlist. The length penalty α is an input (one program for every α).

TF Serving runs these programs only when started with `--xla_cpu_compilation_enabled=true`
(`tensorflow_model_server` disables XLA:CPU otherwise, and the version fails to load on
its warm-up records); exports made with `--no-xla` need no flag.

Shapes: B sentences of a chunk, B̂ its batch bucket, S source length, Ŝ its length
bucket, L output columns.
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding import beam_search

# Sentences per chunk compiled by default: none. At batch 1 XLA removes most of the step's
# cost (by batch 64 the graph path is faster: finished sentences leave its batch), but the
# compiled programs take minutes to build when a version loads, hold more memory, and
# stock tensorflow_model_server runs them only with --xla_cpu_compilation_enabled=true:
# an export for interactive serving asks for them (--xla-max-batch 1).
DEFAULT_MAX_BATCH = 0
_SMALLEST_LENGTH_BUCKET = 16


def buckets(limit, smallest=1):
    """Powers of two from `smallest` up to the first >= `limit`, the last cut to `limit`:
    buckets(128, 16) = (16, 32, 64, 128); buckets(100, 16) = (16, 32, 64, 100)."""
    limit = checks.integer(limit, "limit", 1)
    sizes, size = [], min(checks.integer(smallest, "smallest", 1), limit)
    while size < limit:
        sizes.append(size)
        size *= 2
    return tuple(sizes + [limit])


class CompiledSearch:
    """The XLA-compiled beam search of a translator's small chunks.

    Args:
        model: the translator's model (a :class:`tfxformer.Transformer` or an ensemble list).
        beam_size, extra_length, max_output_tokens, stopping, length_normalization: the
            translator's defaults, fixed in the compiled program.
        max_input_tokens: the longest source, EOS included (the last length bucket).
        max_batch: the largest chunk compiled (>= 1); larger ones go the graph path.

    `applies(source, options)` is the scalar bool tensor saying whether a chunk goes this
    way; `search(source, alpha)` returns the best hypothesis of each sentence:
    (ids (B, L) int32, lengths (B,) int32, scores (B,) float32), as the graph path.
    """

    def __init__(self, model, beam_size, extra_length, max_output_tokens, max_input_tokens,
                 stopping, length_normalization, max_batch=DEFAULT_MAX_BATCH):
        self.model = model
        self.beam_size = checks.integer(beam_size, "beam_size", 1)
        self.extra_length = checks.integer(extra_length, "extra_length", 0)
        self.max_output_tokens = max_output_tokens
        self.stopping, self.length_normalization = stopping, length_normalization
        self.max_batch = checks.integer(max_batch, "max_batch", 1)
        self.batch_buckets = buckets(self.max_batch)
        self.length_buckets = buckets(max_input_tokens, _SMALLEST_LENGTH_BUCKET)
        self._compiled = tf.function(self._search, jit_compile=True, autograph=False)

    @property
    def programs(self):
        """The number of programs a stream of chunks may compile (batch x length buckets)."""
        return len(self.batch_buckets) * len(self.length_buckets)

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

    def or_else(self, source, options, graph):
        """`search(source, options["alpha"])` where :meth:`applies`, else `graph()` (the
        graph path's (ids, lengths, scores)), chosen in the graph (`tf.cond`)."""
        applies = self.applies(source, options)
        if tf.get_static_value(applies) is False:
            return graph()
        return tf.cond(applies, lambda: self.search(source, options["alpha"]), graph)

    def search(self, source, alpha):
        """The best hypotheses of `source` (B, S) (B <= max_batch), padded to its bucket."""
        batch, length = tf.shape(source)[0], tf.shape(source)[1]
        padded_batch = _bucket(batch, self.batch_buckets)
        padded_length = _bucket(length, self.length_buckets)
        rows = tf.concat([tf.range(batch), tf.zeros([padded_batch - batch], tf.int32)], 0)
        padded = tf.pad(tf.gather(tf.cast(source, tf.int32), rows),
                        [[0, 0], [0, padded_length - length]])
        ids, lengths, scores = self._compiled(padded, tf.cast(alpha, tf.float32))
        return ids[:batch], lengths[:batch], scores[:batch]

    def _search(self, source, alpha):
        out = beam_search(self.model, source, self.beam_size, alpha, self.extra_length,
                          self.max_output_tokens, static_cache=True, stopping=self.stopping,
                          length_normalization=self.length_normalization)
        return out.ids[:, 0], out.lengths[:, 0], out.scores[:, 0]


def _bucket(size, sizes):
    """() int32: the smallest of `sizes` (ascending) >= `size` (<= the last)."""
    table = tf.constant(sizes, tf.int32)
    return tf.gather(table, tf.minimum(tf.searchsorted(table, [size])[0], len(sizes) - 1))
