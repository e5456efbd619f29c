#!/usr/bin/env python
"""Table 1 of the paper, measured: forward time and FLOPs of one layer as n grows.

"Table 1: Maximum path lengths, per-layer complexity and minimum number of sequential
operations for different layer types. n is the sequence length, d is the representation
dimension, k is the kernel size of convolutions and r the size of the neighborhood in
restricted self-attention."

| layer                         | complexity per layer | sequential ops | max path length |
|-------------------------------|----------------------|----------------|-----------------|
| self-attention                | O(n^2 d)             | O(1)           | O(1)            |
| recurrent                     | O(n d^2)             | O(n)           | O(n)            |
| convolutional                 | O(k n d^2)           | O(1)           | O(log_k n)      |
| self-attention (restricted)   | O(r n d)             | O(1)           | O(n / r)        |

Layers timed on a (B, n, d) float32 input, forward only, one tf.function each:
- self_attention: tfxformer.layers.MultiHeadAttention(h, d) on (x, x); Q/K/V/O projections
  (8 n d^2) plus the O(n^2 d) attention itself.
- restricted_mask: the same layer with a band `attention_mask` |i - j| <= r. Still dense
  compute: a mask changes which weights are zero, not how much is computed.
- restricted_blocked: restricted attention that really costs O(r n d): the sequence cut into
  blocks of r queries, each attending to the 3r keys of its own and neighbouring blocks
  (band |i - j| <= r inside): MultiHeadAttention(h, d, window=r), the layer's option.
- lstm: keras.layers.LSTM(d, return_sequences=True) (16 n d^2, n sequential steps).
- conv: keras.layers.Conv1D(d, k, padding="same") (2 k n d^2).
- separable_conv: keras.layers.SeparableConv1D(d, k, padding="same") (2 k n d + 2 n d^2).

  python bench/complexity.py                                # d = 512, n = 16 .. 4096
  python bench/complexity.py --d-model 64 --lengths 16,64 --repeats 2   # smoke test

Writes bench/complexity.png (or --plot) and prints a markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics

import benchlib as bl
import flops

KINDS = ("self_attention", "restricted_mask", "restricted_blocked", "lstm", "conv",
         "separable_conv")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lengths", default="16,32,64,128,256,512,1024,2048,4096")
    ap.add_argument("--kernel", type=int, default=3, help="k of the convolutions")
    ap.add_argument("--window", type=int, default=32, help="r of restricted self-attention")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls after one warm-up")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--plot", default=os.path.join(os.path.dirname(__file__), "complexity.png"))
    ap.add_argument("--replot", default=None,
                    help="only redraw --plot from the JSON line that ends this log")
    return ap.parse_args(argv)


def band_mask(queries, keys, r, key_offset=0):
    """(1, queries, keys) bool: True where |i - (j + key_offset)| <= r."""
    import tensorflow as tf

    i = tf.range(queries)[:, None]
    j = tf.range(keys)[None, :] + key_offset
    return (tf.abs(i - j) <= r)[None]


def make_layer(kind, args, n):
    """A tf.function x -> y for one layer kind at length n."""
    import keras
    import tensorflow as tf

    from tfxformer.layers import MultiHeadAttention

    d, r = args.d_model, min(args.window, n)
    if kind in ("self_attention", "restricted_mask", "restricted_blocked"):
        mha = MultiHeadAttention(args.heads, d, window=r if kind == "restricted_blocked" else None)
        mha.build((None, None, d))
        if kind == "self_attention":
            fn = lambda x: mha(x, x)
        elif kind == "restricted_mask":
            mask = band_mask(n, n, r)
            fn = lambda x: mha(x, x, attention_mask=mask)
        else:  # the layer's own O(r n d) blocked path (MultiHeadAttention(window=r))
            fn = lambda x: mha(x, x)
    else:
        layer = {
            "lstm": lambda: keras.layers.LSTM(d, return_sequences=True),
            "gru": lambda: keras.layers.GRU(d, return_sequences=True),
            "conv": lambda: keras.layers.Conv1D(d, args.kernel, padding="same"),
            "separable_conv": lambda: keras.layers.SeparableConv1D(d, args.kernel,
                                                                   padding="same"),
        }[kind]()
        layer.build((args.batch_size, n, d))
        fn = layer
    return tf.function(fn)


def measure(kind, args, n):
    import tensorflow as tf

    x = tf.random.stateless_normal((args.batch_size, n, args.d_model), seed=(1, 2))
    fn = make_layer(kind, args, n)
    fn(x).numpy()  # trace + warm-up
    times = [bl.timed(lambda: fn(x).numpy())[0] for _ in range(args.repeats)]
    return statistics.median(times)


def crossover(rows, a, b):
    """Smallest measured n from which kind a stays costlier than kind b (None if never)."""
    found = None
    for row in reversed(rows):
        if row["ms"][a] <= row["ms"][b]:
            break
        found = row["n"]
    return found


def plot(rows, kinds, args, measured_cross):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [row["n"] for row in rows]
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(12, 4.8))
    for kind in kinds:
        ax_t.plot(ns, [row["ms"][kind] for row in rows], marker="o", label=kind)
        ax_f.plot(ns, [row["gflop"][kind] for row in rows], marker="o", label=kind)
    for ax, label in ((ax_t, "forward time per layer (ms)"), (ax_f, "matmul GFLOP per layer")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.axvline(args.d_model, color="grey", ls="--", lw=1)
        ax.text(args.d_model, ax.get_ylim()[1], " n = d", va="top", color="grey")
        ax.grid(True, which="both", alpha=0.3)
    if measured_cross:
        ax_t.axvline(measured_cross, color="red", ls=":", lw=1.5)
        ax_t.text(measured_cross, ax_t.get_ylim()[0], "self-attn slower \nthan LSTM ",
                  va="bottom", ha="right", color="red")
    ax_t.legend(fontsize=8)
    fig.suptitle(f"Table 1 measured: d = {args.d_model}, batch {args.batch_size}, "
                 f"k = {args.kernel}, r = {args.window}, fp32, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        import json

        with open(args.replot) as f:
            saved = json.loads([line for line in f if line.startswith("{")][-1])
        for key in ("d_model", "batch_size", "kernel", "window"):
            setattr(args, key, saved[key])
        rows = saved["rows"]
        plot(rows, list(rows[0]["ms"]), args, saved["self_attention_slower_than_lstm_from_n"])
        return
    kinds = [k for k in args.kinds.split(",") if k]
    rows = []
    for n in (int(v) for v in args.lengths.split(",")):
        row = {"n": n, "ms": {}, "gflop": {}}
        for kind in kinds:
            row["ms"][kind] = round(1e3 * measure(kind, args, n), 3)
            row["gflop"][kind] = round(flops.layer_flops(
                kind, n, args.d_model, args.batch_size, args.kernel, min(args.window, n)) / 1e9,
                4)
        bl.log(f"n={n:5d} " + " ".join(f"{k}={v:.2f}ms" for k, v in row["ms"].items()))
        rows.append(row)
    cross = crossover(rows, "self_attention", "lstm") if "lstm" in kinds else None
    flop_cross = crossover([{"n": r["n"], "ms": r["gflop"]} for r in rows],
                           "self_attention", "lstm") if "lstm" in kinds else None

    bl.log("\n| n | " + " | ".join(f"{k} ms (GFLOP)" for k in kinds) + " |")
    bl.log("|---|" + "---|" * len(kinds))
    for row in rows:
        bl.log(f"| {row['n']} | " + " | ".join(
            f"{row['ms'][k]:.2f} ({row['gflop'][k]:.3g})" for k in kinds) + " |")
    bl.log(f"\nself-attention slower than LSTM from n = {cross} (measured time), "
           f"from n = {flop_cross} (FLOPs, projections included); paper's rule: n > d = "
           f"{args.d_model}")
    if args.plot:
        plot(rows, kinds, args, cross)
    bl.emit({"bench": "complexity", "d_model": args.d_model, "heads": args.heads,
             "batch_size": args.batch_size, "kernel": args.kernel, "window": args.window,
             "repeats": args.repeats, "rows": rows,
             "self_attention_slower_than_lstm_from_n": cross,
             "self_attention_more_flops_than_lstm_from_n": flop_cross, "plot": args.plot,
             "peak_rss_mib": bl.peak_rss_mib(), **bl.machine()})


if __name__ == "__main__":
    main()
