"""The Transformer side of decoding: encode once, then a step function on the cache.

The searches (:mod:`greedy`, :mod:`beam_search`) know nothing of the model; this module
is the one place that calls `encode`, `init_cache` and `decode_step` and reads the
model's number of positions (and, with a vocabulary shortlist, its embedding rows).
"""

from __future__ import annotations

import tensorflow as tf

from tfxformer import checks
from tfxformer.decoding import model_calls
from tfxformer.decoding.common import DEFAULTS, DecodeStart, check_nonnegative_int
from tfxformer.decoding.shortlist import check_shortlist


def _position_cap(model, max_output_length=None):
    """Largest number of decoder positions: the model's positional-table size, or less if
    asked (`max_output_length`)."""
    cap = model.model_config.max_positions
    if max_output_length is not None:
        cap = min(cap, checks.integer(max_output_length, "max_output_length", 1))
    return cap


def output_limits(source_mask, cap, extra_length=DEFAULTS.extra_length):
    """Per-sentence output length limits (B,) and the output columns L (a scalar).

    limit_b = min(source_length_b + extra_length, cap), counting the EOS (§6.1: "maximum
    output length to input length + 50"). L = min(S + extra_length, cap) depends only on
    the padded shape, so it is a compile-time constant under XLA; every limit_b <= L.
    """
    extra = tf.cast(check_nonnegative_int(extra_length, "extra_length"), tf.int32)
    source_lengths = tf.reduce_sum(tf.cast(source_mask, tf.int32), axis=1)  # (B,)
    limits = tf.clip_by_value(source_lengths + extra, 1, cap)
    length = tf.clip_by_value(tf.shape(source_mask)[1] + extra, 1, cap)
    return limits, length


def transformer_decoder(model, source_ids, beams=1, extra_length=DEFAULTS.extra_length,
                        max_output_length=None, static_cache=False, shortlist=None):
    """Encodes `source_ids` (B, S) and returns the :class:`DecodeStart` of a search with
    `beams` hypotheses per sentence on `model`: a :class:`tfxformer.Transformer`, or any
    model with its `encode`, `init_cache`, `decode_step` (and, optionally, `search_step`),
    `model_config` (`max_positions`, `vocab_size`) and, for a shortlist, `embedding`.

    cache: per decoder layer the self-attention {"key", "value"} (B * beams, H, L, K),
    L = 0 and growing by one position per step unless `static_cache` (then L = the
    output columns, written in place: XLA's layout). context: the cross-attention keys
    and values per layer (B, H, S, K), projected once and shared by a sentence's beams
    (`decode_step(..., beams=beams)`), and the source mask (B, S).

    `shortlist` (V',) sorted vocabulary ids starting with the specials 0..3
    (:func:`tfxformer.decoding.shortlist.shortlist_ids`), or None (the full vocabulary):
    the step function then takes and scores *columns* of the shortlist, its logits
    (N, V') over the shortlist's rows of the shared embedding, gathered here once; map
    the search's output with :func:`tfxformer.decoding.shortlist.to_vocabulary`.

    The step is the model's `search_step(L, rows, static_cache, derived)` (one
    implementation for every search, either cache:
    :class:`tfxformer.models.search_step.SearchStep`; `derived`: an export's
    precomputed weights, :func:`tfxformer.decoding.model_calls.derived_weights`), or
    `model.decode_step` for a model without one (or whose `search_step` returns None).
    The prefill function (a forced target prefix in one pass) is `model.decode_step` on
    one row per sentence, into the same cache layout.
    """
    source_ids = tf.convert_to_tensor(source_ids)
    memory, source_mask = model_calls.encode(model, source_ids)
    limits, length = output_limits(source_mask, _position_cap(model, max_output_length),
                                   extra_length)
    batch = tf.shape(source_ids)[0]
    cache = model.init_cache(memory, length if static_cache else None,
                             batch_size=batch * beams)
    logit_rows = None
    if shortlist is not None:
        shortlist = check_shortlist(shortlist, model.model_config.vocab_size)
        # (V', D) once per batch, in the compute dtype (as SharedEmbedding.logits casts)
        logit_rows = tf.cast(tf.gather(model.embedding.embeddings, shortlist),
                             model.compute_dtype)

    memory = [c["cross"] for c in cache]
    step = None
    if hasattr(model, "search_step"):
        step = model.search_step(length, logit_rows, static_cache,
                                 model_calls.derived_weights(model))
    if step is not None:
        context = {"memory": memory, "cross_mask": source_mask[:, None, None, :]}

        def decode(ids, index, self_cache, context):
            return step(ids, index, self_cache, context["memory"], context["cross_mask"], beams)
    else:
        context = {"memory": memory, "source_mask": source_mask}

        def decode(ids, index, self_cache, context):
            layers = [{"self": s, "cross": c}
                      for s, c in zip(self_cache, context["memory"], strict=True)]
            logits, layers = model.decode_step(ids, context["source_mask"], layers, index,
                                               static_cache=static_cache, beams=beams,
                                               logit_rows=logit_rows)
            return logits, [c["self"] for c in layers]

    def step_fn(ids, index, self_cache, context):
        if shortlist is not None:
            ids = tf.gather(shortlist, ids)  # shortlist columns -> vocabulary ids
        return decode(ids, index, self_cache, context)

    def prefill_fn(ids, index, self_cache, context):
        """t tokens of each sentence (one row each, beams=1) at once: `decode_step`."""
        if shortlist is not None:
            ids = tf.gather(shortlist, ids)
        source_mask = context.get("source_mask")
        if source_mask is None:
            source_mask = context["cross_mask"][:, 0, 0, :]  # (B, S)
        layers = [{"self": s, "cross": c}
                  for s, c in zip(self_cache, context["memory"], strict=True)]
        logits, layers = model.decode_step(ids, source_mask, layers, index,
                                           static_cache=static_cache, beams=1,
                                           logit_rows=logit_rows)
        return logits, [c["self"] for c in layers]

    return DecodeStart(step_fn, [c["self"] for c in cache], context, limits, length,
                       prefill_fn)

