#!/usr/bin/env python
"""Segmented static-shape decoding under XLA against the graph the translator exports.

Conclusion: not adopted. On test_2016 (1,000 sentences; the shipped EN->DE version 5, beam
4, alpha 1.4, batches of 64; both with the chunked top-k) the segments ran 1.24x the
exported graph (58.7 against 47.4 sentences/s, median of 3 alternating passes; per pass
1.04-1.33x) with the same best hypothesis for 1,000 of 1,000 sentences: below the 1.3x the
rule asks, for 22 compiled programs (a first pass of 122 s against 28 s, which TF
Serving's warm-up would pay per batch, cache and source bucket). Here Python drives the
segments; a single-graph version (the segment loop in a tf.while_loop around the
XLA-compiled call) was not built. results/xla_segments.log; 2026-12-03, 2-vCPU Xeon,
nothing else running.

The rule, fixed before measuring: adopted as an export option only if it runs >= 1.3x
the exported graph on test_2016 with identical best hypotheses (and TF Serving's C++
loader runs it); otherwise its figures go here and the code does not ship.

How it decodes: the beam search of tfxformer.decoding.beam_search (the same state and
step, `BeamSearchLoop.step`) runs in *segments*. A segment is one XLA-compiled `tf.while_loop`
over a fixed batch of B_b sentences (a batch bucket) and a self-attention cache of C
slots (a cache bucket, written in place as `static_cache=True` does); it runs until the
cache is full, every real sentence is done, or the running sentences fit the next
smaller batch bucket. Between segments (plain TensorFlow, outside XLA) the finished
sentences' n-best lists are written out, the running ones are compacted into the
smallest batch bucket that holds them (filler rows: copies with limit 0, done at once),
and a full cache is padded to the next cache bucket. So a step pays for at most
2x the positions written and at most 2x the running sentences, in static shapes: the
way TPU decoders keep XLA's shapes fixed while finished sentences leave. The baseline
is the exported graph's search (growing cache, lean step, a finished sentence leaves at
once) on the same ids; both run the shipped EN->DE model's variables with its export's
decoding options (beam 4, its alpha, output limit source + 50 and 128).

  python bench/studies/xla_segments.py [--model DIR] [--limit N] [--repeats 3]
      [--cache-buckets 16,32,64,128] [--batch-buckets 64,32,16,8]

Source lengths are padded to a multiple of --bucket (8) so that XLA compiles one program
per (batch bucket, cache bucket, source bucket), not per length; the first pass compiles
them all (its time is reported apart). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "..", "shared", "data", "multi30k", "test_2016_flickr.en")
SHIPPED = os.path.join(ROOT, "saved_models", "multi30k_en_de")


def int_list(text):
    values = [int(v) for v in text.split(",")]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints like 16,32,64, got {text!r}")
    return values


def batches(ids, batch_size):
    """Length-sorted lists of at most `batch_size` rows (longest first), with their
    sentence indices, as the translator cuts a request."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    return [order[start:start + batch_size] for start in range(0, len(ids), batch_size)]


def padded(rows, width_multiple=1, height=None):
    """(height or len(rows), S) int32, S the longest row rounded up to `width_multiple`;
    rows beyond the real ones hold EOS only."""
    import numpy as np

    width = -(-max(map(len, rows)) // width_multiple) * width_multiple
    array = np.zeros((height or len(rows), width), np.int32)
    array[:, 0] = 3
    for j, row in enumerate(rows):
        array[j, :len(row)] = row
    return array


class SegmentedSearch:
    """Beam search in XLA-compiled static-shape segments (see the module docstring)."""

    def __init__(self, model, beam_size, alpha, extra_length, max_output_length,
                 cache_buckets, batch_buckets):
        import tensorflow as tf

        from tfxformer.decoding.adapter import output_limits
        from tfxformer.decoding.beam_search import BeamSearchLoop
        from tfxformer.ids import BOS_ID, EOS_ID, PAD_ID

        self.model, self.k = model, beam_size
        self.cache_buckets = sorted(cache_buckets)
        self.batch_buckets = sorted(batch_buckets)
        self.extra_length = extra_length
        self.cap = min(model.model_config.max_positions, max_output_length)
        self.output_limits = output_limits

        def step_fn(ids, index, cache, context):
            layers = [{"self": s, "cross": c}
                      for s, c in zip(cache, context["memory"], strict=True)]
            logits, layers = model.decode_step(ids, context["source_mask"], layers, index,
                                               static_cache=True, beams=beam_size)
            return logits, [c["self"] for c in layers]

        self.search = BeamSearchLoop(step_fn, beam_size, alpha, EOS_ID, PAD_ID, BOS_ID)
        self.pad_id = PAD_ID
        self.compiles = set()

        @tf.function(jit_compile=True)
        def segment(state, end, floor):
            def cond(state):
                running = tf.reduce_sum(tf.cast(~self.search.done(state), tf.int32))
                return (state.i < end) & (running > floor)

            (state,) = tf.while_loop(cond, lambda s: (self.search.step(s),), (state,))
            return state, self.search.done(state)

        self.segment = segment
        self.encode = tf.function(lambda ids: model.encode(ids),
                                  reduce_retracing=True)

    def _bucket(self, count):
        return next((b for b in self.batch_buckets if b >= count), count)

    def __call__(self, source):
        """source (B, S) int32 numpy -> (B, K, L) ids, (B, K) scores (numpy)."""
        import numpy as np
        import tensorflow as tf

        from tfxformer.decoding import common
        from tfxformer.decoding.common import NEG_INF, DecodeStart

        k = self.k
        real = source.shape[0]
        height = self._bucket(real)
        if height > real:  # filler rows: EOS only (their limit is set to 0 below)
            source = np.concatenate([source, np.zeros((height - real, source.shape[1]),
                                                      np.int32)])
            source[real:, 0] = 3
        memory, source_mask = self.encode(tf.constant(source))
        limits, columns = self.output_limits(source_mask, self.cap, self.extra_length)
        limits = tf.where(tf.range(height) < real, limits, 0)
        columns = int(columns)
        slots = self.cache_buckets[0]
        cache = self.model.init_cache(memory, slots, batch_size=height * k)
        context = {"memory": [c["cross"] for c in cache], "source_mask": source_mask}
        start = DecodeStart(self.search.step_fn, [c["self"] for c in cache], context,
                            limits, tf.constant(columns))
        state = self.search.initial_state(start)
        rows = np.where(np.arange(height) < real, np.arange(height), -1)
        out_ids = np.full((real, k, columns), self.pad_id, np.int32)
        out_scores = np.full((real, k), NEG_INF, np.float32)
        while True:
            i = int(state.i)
            end = min(slots, columns)
            floor = max([b for b in self.batch_buckets if b < height], default=0)
            self.compiles.add((height, slots, source.shape[1], columns))
            state, done = self.segment(state, tf.constant(end), tf.constant(floor))
            done, i = done.numpy(), int(state.i)
            leaving = done & (rows >= 0)
            if leaving.any():
                ids, scores = self.search.result(state)
                out_ids[rows[leaving]] = ids.numpy()[leaving]
                out_scores[rows[leaving]] = scores.numpy()[leaving]
            keep = np.flatnonzero(~done & (rows >= 0))
            if keep.size == 0 or i >= columns:
                return out_ids, out_scores
            height = self._bucket(keep.size)
            fill = height - keep.size
            order = np.concatenate([keep, np.full(fill, keep[0])]).astype(np.int32)
            rows = np.concatenate([rows[keep], np.full(fill, -1)])
            fields = {name: tf.gather(value, order) for name, value in state._asdict().items()
                      if name not in ("i", "cache", "context")}
            fields["limits"] = tf.where(tf.range(height) < keep.size, fields["limits"], 0)
            cache = common.gather_rows(state.cache, common.hypothesis_rows(
                tf.constant(order), k))
            if i >= slots:  # full: the next cache bucket, zeros after the written slots
                grown = next((c for c in self.cache_buckets if c > slots), columns)
                cache = tf.nest.map_structure(
                    lambda t, extra=grown - slots: tf.pad(t, [[0, 0], [0, 0], [0, extra],
                                                              [0, 0]]), cache)
                slots = grown
            state = state._replace(cache=cache, context=common.gather_rows(state.context, order),
                                   **fields)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=SHIPPED, help="SavedModel, export dir or run dir "
                    "(default: %(default)s)")
    ap.add_argument("--text", default=DATA, help="source sentences, one per line "
                    "(default: test_2016_flickr.en)")
    ap.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    ap.add_argument("--batch-size", type=int, default=64, help="sentences per call")
    ap.add_argument("--bucket", type=int, default=8,
                    help="pad source lengths to a multiple of this for XLA (default 8)")
    ap.add_argument("--cache-buckets", type=int_list, default=[16, 32, 64, 128],
                    help="self-attention cache sizes a segment runs at (default 16,32,64,128)")
    ap.add_argument("--batch-buckets", type=int_list, default=[64, 32, 16, 8],
                    help="batch sizes a segment runs at (default 64,32,16,8)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per decoder")
    args = ap.parse_args(argv)

    import sentencepiece as spm
    import tensorflow as tf

    from tfxformer.decoding import beam_search

    bl.quiet_tf()
    path, model, record, spm_bytes = bl.load_trained(args.model)
    options = record.decoding
    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    with open(args.text, encoding="utf-8") as f:
        lines = f.read().splitlines()
    lines = lines[:args.limit] if args.limit else lines
    ids = [sp.encode(line)[:options.max_input_tokens - 1] + [3] for line in lines]
    work = batches(ids, args.batch_size)

    graph = tf.function(lambda src: beam_search(
        model, src, beam_size=options.beam_size, alpha=options.alpha,
        extra_length=options.extra_length, max_output_length=options.max_output_tokens).ids,
        reduce_retracing=True)
    segmented = SegmentedSearch(model, options.beam_size, options.alpha,
                                options.extra_length, options.max_output_tokens,
                                args.cache_buckets, args.batch_buckets)

    def run_graph():
        return [graph(tf.constant(padded([ids[i] for i in b]))).numpy()[:, 0] for b in work]

    def run_segmented():
        return [segmented(padded([ids[i] for i in b], args.bucket))[0][:, 0] for b in work]

    systems = {"graph_exported": run_graph, "xla_segments": run_segmented}
    first, times, outputs = {}, {name: [] for name in systems}, {}
    for name, fn in systems.items():
        first[name], _ = bl.timed(fn)
        bl.log(f"{name}: first pass (trace/compile + run) {first[name]:.1f} s")
    for repeat in range(args.repeats):
        for name, fn in systems.items():
            seconds, outputs[name] = bl.timed(fn)
            times[name].append(seconds)
            bl.log(f"{name} pass {repeat}: {seconds:.2f} s, {len(lines) / seconds:.1f} sent/s")

    def strip(row):
        row = list(row)
        return row[:row.index(0)] if 0 in row else row

    same = sum(strip(a) == strip(b)
               for x, y in zip(*outputs.values(), strict=True) for a, b in zip(x, y, strict=True))
    speed = {name: round(len(lines) / statistics.median(t), 1) for name, t in times.items()}
    bl.emit({"bench": "xla_segments", "model": path, "sentences": len(lines),
             "alpha": options.alpha, "cache_buckets": args.cache_buckets,
             "batch_buckets": args.batch_buckets, "programs": len(segmented.compiles),
             "first_pass_s": {k: round(v, 1) for k, v in first.items()},
             "pass_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
             "sentences_per_second": speed,
             "segments_over_graph": round(speed["xla_segments"] / speed["graph_exported"], 2),
             "identical_best": f"{same}/{len(lines)}", "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


if __name__ == "__main__":
    main()
