#!/usr/bin/env python
"""A/B micro-benchmarks of the hot spots the profiles point at (base shapes, fp32).

Conclusion: the winners were adopted (one 2-D GEMM for the weight projections and the logits,
`tfxformer.layers.ops.matmul_last`; `tfxformer.layers.norm.LayerNorm`; the fused loss);
the cache-write and int8 variants lost (stock TensorFlow int8 GEMMs are 3-5x slower than
fp32 on the CPU measured), so several cases' variant "a" no longer describes tfxformer.

Each case times its variants alternately in one process (median of --repeats rounds), so
the ratios hold on a shared machine. Variant "a" is what tfxformer did when the case was
written; the others are candidate fixes. Shapes follow the peers' workloads: training
B=128, T=32, D=512, V=32000; beam search 64 sentences x beam 4 = 256 hypotheses, cache
length L, S=24.

  python bench/studies/microbench.py                 # all cases
  python bench/studies/microbench.py --cases logits,cache_write --repeats 5
  python bench/studies/microbench.py --small         # smoke test with small shapes

Cases:
  logits       tied logits x E^T, forward + backward: (a) tf.matmul on (B, T, D) x (V, D)^T,
               a broadcast batched matmul (its weight gradient is a (B, V, D) tensor summed
               over B); (b) the same on (B*T, D) rows, one GEMM.
  projection   Q, K, V projections of self-attention, forward + backward: (a) 3 broadcast
               batched matmuls (B, T, D) x (D, D); (b) 3 GEMMs on (B*T, D); (c) one fused
               GEMM with a (D, 3D) kernel.
  decode_logits  per-step logits of 256 hypotheses: (a) (256, 1, D) broadcast batched
               matmul; (b) (256, D) GEMM.
  cache_write  writing one step's keys into a (256, H, L, K) cache: (a) the select write of
               tfxformer's static (XLA) cache (gather + select over all L positions);
               (b) tf.tensor_scatter_nd_update on the cache transposed to (L, ...);
               (c) XLA dynamic_update_slice (jit_compile); (d) (a) under jit_compile;
               (e) tf.tensor_scatter_nd_update addressing the (n, h, index) rows directly
               (no transposes).
  beam_reorder the per-step reorder of 12 self-attention cache tensors (6 layers x K/V):
               (a) 12 tf.gather; (b) one tf.gather on a stacked (12, 256, H, L, K) tensor.
  cross_attention  one decoder cross-attention core (QK^T, softmax, AV): (a) memory tiled
               to 256 rows (B*beam, H, S, K); (b) memory kept once per sentence
               (B, H, S, K), the beam's queries as extra query rows.
  embedding_grad  gradient of the shared embedding (2 lookups + logits): (a) tf.gather's
               IndexedSlices summed into the dense gradient by TF (UnsortedSegmentSum);
               (b) a lookup with a dense custom gradient (tf.tensor_scatter_nd_add).
  loss         label-smoothed cross-entropy over (B, T, V) logits, forward + backward:
               (a) tfxformer's label_smoothed_nll (log_softmax, tf.gather with batch_dims,
               whose gradient is an UnsortedSegmentSum into a dense (B, T, V) tensor);
               (b) sparse_softmax_cross_entropy_with_logits + (logsumexp - mean) smoothing.
  int8_gemm    reduced-precision GEMMs of beam decoding with ops stock TensorFlow (and so TF
               Serving) ships, activations (N, D) x weights (D, M) for the shapes of the
               shipped Multi30k model (D 128: logits M = 8000, FFN M = 256) and of base
               (D 512: logits M = 32000, FFN M = 2048): (a) fp32 tf.matmul; (b) bf16
               tf.matmul; (c) int8 x int8 -> int32 tf.matmul (what Keras int8 Dense runs),
               with the per-call activation quantization and the dequantize; (d)
               QuantizedMatMul quint8 x quint8 -> qint32 (the gemmlowp kernel; the only
               QuantizedMatMul type pair registered on CPU) with quantize/dequantize.
               Weights are quantized once, outside the timed call.
  layer_norm   one layer normalization, forward only, at the decoding shapes (N x 1 x D,
               64 x S x D): (a) keras.layers.LayerNormalization (moments + folded scale);
               (b) tfxformer.layers.norm.LayerNorm (centre, mean of squares, rsqrt).
  vocab_topk   beam candidates from the (256, V) logits: (a) log-softmax over V, PAD/BOS
               select, + hypothesis scores, top-2K over beam*V (tfxformer until the chunked
               top-k); (b) top-(2K+2) of the raw logits per hypothesis, normalized by
               logsumexp afterwards; (c) (a) with tfxformer.decoding.topk.top_k (chunk
               maxima, then TopK over the 2K best chunks: tfxformer now).

--vocab-size sets V for every case (default 32000; the shipped Multi30k model has 8000).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402
from patches import fused_label_smoothed_nll  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="logits,projection,decode_logits,cache_write,"
                                       "beam_reorder,cross_attention,vocab_topk,embedding_grad,"
                                       "loss,int8_gemm,layer_norm")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cache-length", type=int, default=32)
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="V of every case (default: the workloads' 32000)")
    ap.add_argument("--small", action="store_true", help="small shapes (smoke test)")
    return ap.parse_args(argv)


def compare(name, variants, repeats):
    """Times tf.functions {label: fn} alternately; returns {label: median ms}."""
    for fn in variants.values():
        fn()  # trace, warm up
    times = {label: [] for label in variants}
    for _ in range(repeats):
        for label, fn in variants.items():
            times[label].append(bl.timed(fn)[0])
    med = {label: round(1e3 * statistics.median(t), 2) for label, t in times.items()}
    base = next(iter(med.values()))
    bl.log(f"{name}: " + ", ".join(f"{k} {v} ms (x{base / v:.2f})" for k, v in med.items()))
    return med


def sync(out):
    import tensorflow as tf

    for t in tf.nest.flatten(out):
        t.numpy()


def case_logits(sz, repeats):
    import tensorflow as tf

    b, t, d, v = sz["B"], sz["T"], sz["D"], sz["V"]
    x = tf.Variable(tf.random.normal((b, t, d)))
    e = tf.Variable(tf.random.normal((v, d), stddev=d ** -0.5))

    def grads(flat):
        with tf.GradientTape() as tape:
            if flat:
                logits = tf.reshape(tf.matmul(tf.reshape(x, [-1, d]), e, transpose_b=True),
                                    [b, t, v])
            else:
                logits = tf.matmul(x, e, transpose_b=True)
            loss = tf.reduce_sum(logits * 1e-3)
        return tape.gradient(loss, [x, e])

    fa, fb = tf.function(lambda: grads(False), autograph=False), tf.function(
        lambda: grads(True), autograph=False)
    out = {"b_2d_gemm": lambda: sync(fb())}
    rss_b = (sync(fb()), bl.peak_rss_mib())[1]
    out["a_broadcast_batch_matmul"] = lambda: sync(fa())
    rss_a = (sync(fa()), bl.peak_rss_mib())[1]
    res = compare("logits fwd+bwd", {"a_broadcast_batch_matmul": out["a_broadcast_batch_matmul"],
                                     "b_2d_gemm": out["b_2d_gemm"]}, repeats)
    res["peak_rss_mib_after_b_then_a"] = [rss_b, rss_a]
    bl.log(f"  peak RSS after running (b): {rss_b} MiB, after also running (a): {rss_a} MiB")
    return res


def case_projection(sz, repeats):
    import tensorflow as tf

    b, t, d = sz["B"], sz["T"], sz["D"]
    x = tf.Variable(tf.random.normal((b, t, d)))
    ws = [tf.Variable(tf.random.normal((d, d), stddev=d ** -0.5)) for _ in range(3)]

    def grads(mode):
        with tf.GradientTape() as tape:
            if mode == "a":
                outs = [tf.matmul(x, w) for w in ws]
            elif mode == "b":
                flat = tf.reshape(x, [-1, d])
                outs = [tf.matmul(flat, w) for w in ws]
            else:
                outs = tf.split(tf.matmul(tf.reshape(x, [-1, d]), tf.concat(ws, axis=1)), 3, 1)
            loss = tf.add_n([tf.reduce_sum(o * (i + 1.0)) for i, o in enumerate(outs)])
        return tape.gradient(loss, [x, *ws])

    fns = {f"{m}_{label}": tf.function(lambda m=m: grads(m)) for m, label in
           (("a", "3_broadcast_batch_matmul"), ("b", "3_gemm"), ("c", "fused_qkv_gemm"))}
    return compare("QKV projection fwd+bwd", {k: (lambda f=f: sync(f())) for k, f in fns.items()},
                   repeats)


def case_decode_logits(sz, repeats):
    import tensorflow as tf

    n, d, v = sz["N"], sz["D"], sz["V"]
    x = tf.random.normal((n, 1, d))
    e = tf.random.normal((v, d), stddev=d ** -0.5)
    fa = tf.function(lambda: tf.matmul(x, e, transpose_b=True))
    fb = tf.function(lambda: tf.matmul(tf.reshape(x, [n, d]), e, transpose_b=True))
    return compare("decode-step logits (256 hyps)", {"a_broadcast_batch_matmul":
                   lambda: sync(fa()), "b_2d_gemm": lambda: sync(fb())}, repeats)


def case_cache_write(sz, repeats, length):
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla

    n, h, k = sz["N"], sz["H"], sz["K"]
    cache = tf.random.normal((n, h, length, k))
    new = tf.random.normal((n, h, 1, k))
    index = tf.constant(length // 2)

    def scatter(c, x, i):  # positions i of axis 2 <- x[:, :, 0]
        c = tf.transpose(c, [2, 0, 1, 3])  # (L, N, H, K)
        c = tf.tensor_scatter_nd_update(c, [[i]], tf.transpose(x, [2, 0, 1, 3]))
        return tf.transpose(c, [1, 2, 0, 3])

    fa = tf.function(lambda: select_write(cache, new, index))
    fb = tf.function(lambda: scatter(cache, new, index))
    fc = tf.function(lambda: xla.dynamic_update_slice(cache, new, [0, 0, index, 0]),
                     jit_compile=True)
    fd = tf.function(lambda: select_write(cache, new, index), jit_compile=True)
    fe = tf.function(lambda: scatter_rows(cache, new, index))
    return compare(f"cache write (N={n}, L={length})", {
        "a_select_write": lambda: sync(fa()), "b_scatter_nd_transposed": lambda: sync(fb()),
        "c_xla_dynamic_update_slice": lambda: sync(fc()),
        "d_select_write_under_xla": lambda: sync(fd()),
        "e_scatter_nd_rows": lambda: sync(fe())}, repeats)


def select_write(cache, new, index):
    """cache (N, H, L, K) with positions [index, index + T) of axis 2 <- new (N, H, T, K):
    a gather + select over all L positions, the formulation of tfxformer's static-cache
    write in layers/attention.py (written out here: the layer's helper is private)."""
    import tensorflow as tf

    offsets = tf.range(tf.shape(cache)[2]) - index  # (L,): position - index
    inside = tf.logical_and(offsets >= 0, offsets < tf.shape(new)[2])
    spread = tf.gather(new, tf.clip_by_value(offsets, 0, tf.shape(new)[2] - 1), axis=2)
    return tf.where(inside[None, None, :, None], spread, cache)


def scatter_rows(cache, new, index):
    """cache (N, H, L, K)[:, :, index] = new[:, :, 0] with one tensor_scatter_nd_update whose
    indices address (n, h, index) rows of K values: no transposes, no full select."""
    import tensorflow as tf

    shape = tf.shape(cache)
    n, h = shape[0], shape[1]
    grid = tf.stack(tf.meshgrid(tf.range(n), tf.range(h), indexing="ij"), axis=-1)  # (N, H, 2)
    at = tf.fill([n, h, 1], tf.cast(index, tf.int32))
    indices = tf.reshape(tf.concat([grid, at], axis=-1), [-1, 3])
    updates = tf.reshape(tf.cast(new, cache.dtype), [-1, shape[3]])
    return tf.tensor_scatter_nd_update(cache, indices, updates)


def case_vocab_topk(sz, repeats):
    """Beam candidates from (B*beam, V) logits: (a) tfxformer's log_softmax over V, PAD/BOS
    select, add of the hypothesis scores, top-2K over beam*V; (b) top-(2K+2) of the raw
    logits per hypothesis, minus logsumexp, forbidden ids dropped, top-2K of 4*(2K+2)."""
    import tensorflow as tf

    n, v, beam = sz["N"], sz["V"], 4
    b, k2 = n // beam, 2 * beam
    logits = tf.random.normal((n, v))
    alive = tf.random.normal((b, beam))
    forbidden = tf.constant([0, 2])  # PAD, BOS

    def current():
        lp = tf.nn.log_softmax(logits)
        bad = tf.reduce_any(tf.range(v)[:, None] == forbidden[None, :], axis=-1)
        lp = tf.where(bad[None, :], -1e9, lp)
        lp = tf.reshape(lp, [b, beam, v]) + alive[:, :, None]
        return tf.math.top_k(tf.reshape(lp, [b, beam * v]), k=k2)

    def chunked():
        from tfxformer.decoding.topk import top_k

        lp = tf.nn.log_softmax(logits)
        bad = tf.reduce_any(tf.range(v)[:, None] == forbidden[None, :], axis=-1)
        lp = tf.where(bad[None, :], -1e9, lp)
        lp = tf.reshape(lp, [b, beam, v]) + alive[:, :, None]
        return top_k(tf.reshape(lp, [b, beam * v]), k2)

    def fused():
        top, ids = tf.math.top_k(logits, k=k2 + 2)  # (N, 2K+2)
        lse = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
        bad = tf.reduce_any(ids[..., None] == forbidden, axis=-1)
        scores = tf.where(bad, -1e9, top - lse)
        scores = tf.reshape(scores, [b, beam * (k2 + 2)]) + tf.repeat(alive, k2 + 2, axis=1)
        best, pos = tf.math.top_k(scores, k=k2)
        return best, tf.gather(tf.reshape(ids, [b, -1]), pos, batch_dims=1)

    fa, fb, fc = tf.function(current), tf.function(fused), tf.function(chunked)
    return compare(f"beam candidates over V = {v}", {
        "a_logsoftmax_topk_over_beam_x_V": lambda: sync(fa()),
        "b_topk_per_hyp_then_normalize": lambda: sync(fb()),
        "c_logsoftmax_chunked_topk": lambda: sync(fc())}, repeats)


def case_beam_reorder(sz, repeats, length):
    import tensorflow as tf

    n, h, k, layers = sz["N"], sz["H"], sz["K"], sz["layers"]
    tensors = [tf.random.normal((n, h, length, k)) for _ in range(2 * layers)]
    stacked = tf.stack(tensors)
    rows = tf.random.shuffle(tf.range(n))
    fa = tf.function(lambda: [tf.gather(t, rows) for t in tensors])
    fb = tf.function(lambda: tf.gather(stacked, rows, axis=1))
    return compare(f"beam cache reorder ({2 * layers} x ({n}, {h}, {length}, {k}))", {
        "a_12_gathers": lambda: sync(fa()), "b_one_stacked_gather": lambda: sync(fb())}, repeats)


def case_cross_attention(sz, repeats):
    import tensorflow as tf

    b, beam, h, s, k = sz["N"] // 4, 4, sz["H"], sz["S"], sz["K"]
    q = tf.random.normal((b * beam, h, 1, k))
    mem_k, mem_v = tf.random.normal((b, h, s, k)), tf.random.normal((b, h, s, k))
    tiled_k, tiled_v = tf.repeat(mem_k, beam, axis=0), tf.repeat(mem_v, beam, axis=0)

    def tiled():
        w = tf.nn.softmax(tf.matmul(q, tiled_k, transpose_b=True))
        return tf.matmul(w, tiled_v)  # (B*beam, H, 1, K)

    def grouped():
        qg = tf.reshape(tf.transpose(tf.reshape(q, [b, beam, h, k]), [0, 2, 1, 3]),
                        [b, h, beam, k])  # the beam's queries as rows
        w = tf.nn.softmax(tf.matmul(qg, mem_k, transpose_b=True))
        out = tf.matmul(w, mem_v)  # (B, H, beam, K)
        return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [b * beam, h, 1, k])

    fa, fb = tf.function(tiled), tf.function(grouped)
    return compare("cross-attention core per layer", {
        "a_tiled_memory": lambda: sync(fa()), "b_memory_once_per_sentence": lambda: sync(fb())},
        repeats)


def case_embedding_grad(sz, repeats):
    """Gradient of the shared embedding: source and target lookups (IndexedSlices) plus the
    dense logits gradient. (a) as tfxformer: two tf.gather lookups, TF sums the slices into
    the dense gradient (UnsortedSegmentSum); (b) a lookup whose custom gradient is dense,
    built with tf.tensor_scatter_nd_add."""
    import tensorflow as tf

    b, t, d, v = sz["B"], sz["T"], sz["D"], sz["V"]
    e = tf.Variable(tf.random.normal((v, d), stddev=d ** -0.5))
    x = tf.random.normal((b * t, d))
    src = tf.random.uniform((b, t), 3, v, tf.int32)
    tgt = tf.random.uniform((b, t), 3, v, tf.int32)

    @tf.custom_gradient
    def dense_lookup(table, ids):
        def grad(upstream):
            flat = tf.reshape(ids, [-1, 1])
            rows = tf.reshape(upstream, [-1, tf.shape(table)[1]])
            return tf.tensor_scatter_nd_add(tf.zeros_like(table), flat, rows), None
        return tf.gather(table, ids), grad

    def grads(lookup):
        with tf.GradientTape() as tape:
            a, c = lookup(e, src), lookup(e, tgt)
            logits = tf.matmul(x, e, transpose_b=True)
            loss = tf.reduce_sum(a) + 2.0 * tf.reduce_sum(c) + 1e-3 * tf.reduce_sum(logits)
        return tf.convert_to_tensor(tape.gradient(loss, e))

    fa = tf.function(lambda: grads(tf.gather), autograph=False)
    fb = tf.function(lambda: grads(dense_lookup), autograph=False)
    return compare("shared-embedding gradient (2 lookups + logits)", {
        "a_gather_indexed_slices": lambda: sync(fa()),
        "b_dense_scatter_add_grad": lambda: sync(fb())}, repeats)


def case_loss(sz, repeats):
    """Label-smoothed loss over (B, T, V) logits, forward + backward: (a) tfxformer's
    label_smoothed_nll (log_softmax, gather, mean); (b) fused_label_smoothed_nll."""
    import tensorflow as tf

    from tfxformer.losses import label_smoothed_nll

    b, t, v = sz["B"], sz["T"], sz["V"]
    logits = tf.Variable(tf.random.normal((b, t, v)))
    labels = tf.random.uniform((b, t), 3, v, tf.int32)

    def grads(fn):
        with tf.GradientTape() as tape:
            loss, _ = fn(labels, logits, 0.1)
        return loss, tape.gradient(loss, logits)

    fa = tf.function(lambda: grads(label_smoothed_nll), autograph=False)
    fb = tf.function(lambda: grads(fused_label_smoothed_nll), autograph=False)
    (la, ga), (lb, gb) = fa(), fb()
    diff = float(tf.reduce_max(tf.abs(ga - gb)))
    bl.log(f"  loss {float(la):.4f} vs {float(lb):.4f}, max |grad diff| {diff:.2e}")
    return compare("label-smoothed loss fwd+bwd", {"a_log_softmax_gather": lambda: sync(fa()),
                   "b_fused_sparse_ce": lambda: sync(fb())}, repeats)


def gemm_variants(x, w):
    """{label: tf.function} computing x @ w at fp32, bf16, int8 and with QuantizedMatMul
    (weights quantized here, once; activations in each call)."""
    import tensorflow as tf

    w_bf16 = tf.cast(w, tf.bfloat16)
    w_scale = tf.reduce_max(tf.abs(w), axis=0) / 127.0  # per output column
    w_int8 = tf.cast(tf.round(w / w_scale), tf.int8)
    qw = tf.quantization.quantize(w, tf.reduce_min(w), tf.reduce_max(w), tf.quint8,
                                  mode="MIN_FIRST")

    def fp32():
        return tf.matmul(x, w)

    def bf16():
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), w_bf16), tf.float32)

    def int8():
        x_scale = tf.reduce_max(tf.abs(x), axis=1, keepdims=True) / 127.0
        xq = tf.cast(tf.round(x / x_scale), tf.int8)
        acc = tf.matmul(xq, w_int8, output_type=tf.int32)
        return tf.cast(acc, tf.float32) * x_scale * w_scale

    def quantized_matmul():
        qx = tf.quantization.quantize(x, tf.reduce_min(x), tf.reduce_max(x), tf.quint8,
                                      mode="MIN_FIRST")
        acc, lo, hi = tf.raw_ops.QuantizedMatMul(
            a=qx.output, b=qw.output, min_a=qx.output_min, max_a=qx.output_max,
            min_b=qw.output_min, max_b=qw.output_max, Toutput=tf.qint32)
        return tf.quantization.dequantize(acc, lo, hi, mode="MIN_FIRST")

    return {name: tf.function(fn, autograph=False) for name, fn in (
        ("a_fp32", fp32), ("b_bf16", bf16), ("c_int8_matmul", int8),
        ("d_quantized_matmul", quantized_matmul))}


def case_int8_gemm(sz, repeats):
    import tensorflow as tf

    n = sz["N"]
    shapes = [(128, 8000), (128, 256), (512, 32000), (512, 2048)]
    if sz["D"] < 128:
        shapes = [(sz["D"], sz["V"]), (sz["D"], 4 * sz["D"])]
    out = {}
    for d, m in shapes:
        variants = gemm_variants(tf.random.normal((n, d)), tf.random.normal((d, m)) * 0.05)
        ref = variants["a_fp32"]()
        for name, fn in list(variants.items())[1:]:
            err = float(tf.reduce_max(tf.abs(fn() - ref)) / tf.reduce_max(tf.abs(ref)))
            bl.log(f"  {n}x{d} @ {d}x{m} {name}: max |error| / max |fp32| = {err:.3f}")
        out[f"{n}x{d}x{m}"] = compare(
            f"GEMM {n}x{d} @ {d}x{m}",
            {name: (lambda fn=fn: sync(fn())) for name, fn in variants.items()}, repeats)
    return out

def case_layer_norm(sz, repeats):
    import keras
    import tensorflow as tf

    from tfxformer.layers.norm import LayerNorm

    out = {}
    for shape in ((sz["N"], 1, sz["D"]), (64, sz["S"], sz["D"]), (sz["N"], 1, 128)):
        x = tf.random.normal(shape)
        variants = {}
        for label, cls in (("a_keras", keras.layers.LayerNormalization),
                           ("b_tfxformer", LayerNorm)):
            layer = cls(epsilon=1e-6)
            layer.build(shape)
            # 20 norms in a row per call, so the call overhead does not hide the op cost
            fn = tf.function(lambda layer=layer, x=x: tf.foldl(
                lambda a, _, layer=layer: layer(a), tf.range(20), initializer=x),
                autograph=False)
            variants[label] = lambda fn=fn: sync(fn())
        out["x".join(map(str, shape))] = compare(f"20 layer norms {shape}", variants, repeats)
    return out


def main(argv=None):
    args = parse_args(argv)
    sz = dict(B=128, T=32, D=512, V=32000, N=256, H=8, K=64, S=24, layers=6)
    if args.small:
        sz = dict(B=8, T=8, D=32, V=1000, N=16, H=4, K=8, S=6, layers=2)
    if args.vocab_size:
        sz["V"] = args.vocab_size
    results = {}
    for case in args.cases.split(","):
        if case in ("cache_write", "beam_reorder"):
            results[case] = globals()[f"case_{case}"](sz, args.repeats, args.cache_length)
        else:
            results[case] = globals()[f"case_{case}"](sz, args.repeats)
    bl.emit({"bench": "microbench", "shapes": sz, "cache_length": args.cache_length,
             "repeats": args.repeats, "results_ms": results, "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


if __name__ == "__main__":
    main()
