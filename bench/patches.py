"""The benchmarks' runtime patches of tfxformer, all in one place (nothing under
`tfxformer/` is edited). Each replaces one *public* function of tfxformer with a sketch
of a proposed change, so `whatif.py`, `train_speed.py`, `decode_speed.py` and
`profile_ops.py` (`--patch NAME[,NAME]`) can measure it end to end:

  fused_loss  the Trainer's loss from fused kernels (:func:`fused_label_smoothed_nll`):
              sparse_softmax_cross_entropy_with_logits + a (logsumexp - mean) smoothing
              term, instead of log_softmax + tf.gather (whose gradient is an
              UnsortedSegmentSum into a dense (B, T, V) tensor). Replaces
              `tfxformer.trainer.label_smoothed_nll`.
  fused_topk  beam search's candidates from the top 2K+2 raw logits of each hypothesis,
              normalized by logsumexp (:func:`fused_top_extensions`), instead of a
              log-softmax, a PAD/BOS select and an add over all (B*K, V) entries before
              one top-k over K*V. Replaces `tfxformer.decoding.beam_search.top_extensions`.

  plain_topk  beam search's top-k over the K*V candidates of a sentence by one
              `tf.math.top_k` instead of the chunked top-k (:mod:`tfxformer.decoding.topk`):
              what the search ran before it, for before/after figures. Replaces
              `tfxformer.decoding.topk.top_k`.
  layer_step  the decoding step through the Keras layers (`model.decode_step`) instead of
              the lean step (:mod:`tfxformer.decoding.lean`): what the search ran before
              the lean step, for before/after figures. Replaces
              `tfxformer.decoding.lean.unsupported`.

Earlier sketches that tfxformer has since adopted or that measured slower are gone (their
figures and verdicts stay in bench/README.md): `matmul2d` (now `layers/ops.matmul_last`),
`write_scatter` and `write_rows` (scatter writes of the static cache: 0.48x and
0.83-0.94x; the non-XLA path now grows its cache instead).

This module imports no other bench script (benchlib and the scripts may import it).
"""

from __future__ import annotations

import importlib


def fused_label_smoothed_nll(labels, logits, label_smoothing=0.1):
    """tfxformer.losses.label_smoothed_nll from fused kernels: the NLL term by
    sparse_softmax_cross_entropy_with_logits, the uniform term as logsumexp - mean(logits)
    (= -mean(log_softmax)). No (B, T, V) log-softmax, no gather."""
    import tensorflow as tf

    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    smooth = tf.reduce_logsumexp(logits, axis=-1) - tf.reduce_mean(logits, axis=-1)
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    mask = tf.cast(tf.not_equal(labels, 0), tf.float32)
    return tf.reduce_sum(per_token * mask), tf.reduce_sum(mask)


def fused_top_extensions(logits, alive_log_probs, count, pad_id=0, bos_id=2):
    """`tfxformer.decoding.top_extensions` (same arguments and results) from the top
    count + 2 raw logits of each hypothesis: count legal candidates per hypothesis even
    if PAD and BOS are among its best, then logsumexp-normalized; identical outputs."""
    import tensorflow as tf

    from tfxformer.decoding.common import NEG_INF

    if logits.shape.rank == 3:
        logits = logits[:, -1]
    logits = tf.cast(logits, tf.float32)  # (B*K, V)
    width = count + 2
    top, ids = tf.math.top_k(logits, k=width)
    normalizer = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
    scores = tf.where((ids == pad_id) | (ids == bos_id), NEG_INF, top - normalizer)
    batch, k = tf.shape(alive_log_probs)[0], tf.shape(alive_log_probs)[1]
    scores = tf.reshape(scores, [batch, k, width]) + alive_log_probs[:, :, None]
    log_probs, index = tf.math.top_k(tf.reshape(scores, [batch, k * width]), k=count)
    tokens = tf.gather(tf.reshape(ids, [batch, k * width]), index, batch_dims=1)
    return log_probs, index // width, tokens


def plain_top_k(x, k, chunk=None):
    """`tfxformer.decoding.topk.top_k` as one `tf.math.top_k` (same results)."""
    import tensorflow as tf

    del chunk
    return tuple(tf.math.top_k(x, k))


# name -> (module, public function it replaces, replacement)
PATCHES = {
    "fused_loss": ("tfxformer.trainer", "label_smoothed_nll", fused_label_smoothed_nll),
    "fused_topk": ("tfxformer.decoding.beam_search", "top_extensions", fused_top_extensions),
    "layer_step": ("tfxformer.decoding.lean", "unsupported", lambda model: "patched off"),
    "plain_topk": ("tfxformer.decoding.topk", "top_k", plain_top_k),
}


def apply(names):
    """Applies the comma-separated patches `names` (see the module docstring)."""
    for name in names.split(","):
        if name not in PATCHES:
            raise SystemExit(f"unknown --patch {name!r}; choose from {sorted(PATCHES)}")
        module_name, attribute, replacement = PATCHES[name]
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute) or attribute.startswith("_"):
            raise SystemExit(f"patch {name}: {module_name}.{attribute} is not a public name "
                             "of tfxformer any more; update bench/patches.py")
        original = getattr(module, attribute)
        setattr(module, attribute, replacement)
        # The package may re-export it (tfxformer.decoding.top_extensions): patch that too.
        package = importlib.import_module(module_name.rpartition(".")[0])
        if getattr(package, attribute, None) is original:
            setattr(package, attribute, replacement)
