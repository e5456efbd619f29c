#!/usr/bin/env python
"""Where the time goes: op-level profile of the training step or of a decoding call.

Runs the same workloads as train_speed.py / decode_speed.py (graph mode, no XLA: XLA fuses
the ops into clusters the profiler cannot split), records --steps steps (or calls) with the
TensorFlow profiler, reads the trace (XPlane protobuf, no TensorBoard needed) and sums the
duration of every executed TF op. Three tables follow, in ms per step and % of summed op
time: by op type, by model component (forward / backward), and the top op names with the
layer index folded (layer_0 .. layer_5 -> layer_N). By default TensorFlow runs one op at a
time here (--inter-op 1), so op durations do not overlap and sum to about the wall time
(with 2 inter-op threads, an op waiting for the shared intra-op pool looks long).

  python bench/profile_ops.py --what train --steps 2
  python bench/profile_ops.py --what beam --steps 2
  python bench/profile_ops.py --what train --preset tiny --vocab-size 1000   # smoke test
  python bench/profile_ops.py --what translate --model saved_models/multi30k_en_de \
      --text ../shared/data/multi30k/test_2016_flickr.en --batch-size 64 --steps 3

`--what translate` profiles a SavedModel translator (strings in, strings out: the
`serving_default` signature) on the first --batch-size lines of --text: real sentences
that end at different steps, as served. Besides the tables it reports the op runs per
call and the median op duration, which say whether per-op overhead or arithmetic
dominates (a tiny model runs thousands of microsecond ops per call).

The last line printed is one JSON object (the tables, top entries only).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import tempfile
import time

import benchlib as bl
import patches

CONTAINERS = {"StatefulPartitionedCall", "PartitionedCall", "While", "StatelessWhile", "If",
              "StatelessIf", "Case", "_XlaRun", "_XlaCompile"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=["train", "beam", "greedy", "translate"], default="train")
    ap.add_argument("--model", default=None,
                    help="--what translate: a SavedModel version dir or a dir of versions")
    ap.add_argument("--text", default=None,
                    help="--what translate: source sentences, one per line")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--batch-size", type=int, default=None, help="128 train / 64 decode")
    ap.add_argument("--src-len", type=int, default=None, help="32 train / 24 decode")
    ap.add_argument("--tgt-len", type=int, default=32, help="target length (train)")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--precision", choices=sorted(bl.POLICIES), default="fp32")
    ap.add_argument("--steps", type=int, default=2, help="profiled steps / calls")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--patch", default=None,
                    help="apply bench/patches.py patches first (profile a proposed fix)")
    ap.add_argument("--inter-op", type=int, default=1,
                    help="TF inter-op threads; 1 (default) runs one op at a time, so op "
                         "durations do not overlap and add up to the step; 0 = TF default")
    return ap.parse_args(argv)


def workload(args):
    """(function running one step/call, description) after one untimed warm-up."""
    if args.what == "train":
        import train_speed

        targs = train_speed.parse_args([
            "--preset", args.preset, "--vocab-size", str(args.vocab_size),
            "--precision", args.precision])
        bl.set_precision(args.precision)
        config, _, step = train_speed.build_tfxformer(targs)
        batch, src_len = args.batch_size or 128, args.src_len or 32
        data = bl.fixed_batches(2, batch, src_len, args.tgt_len, args.vocab_size, seed=2)
        step(*data[0])
        return lambda: step(*data[1]), f"train step B={batch} S={src_len} T={args.tgt_len}"
    if args.what == "translate":
        return translate_workload(args)
    import decode_speed

    dargs = decode_speed.parse_args([
        "--preset", args.preset, "--vocab-size", str(args.vocab_size),
        "--precision", args.precision, "--beam-size", str(args.beam_size)]
        + (["--greedy"] if args.what == "greedy" else []))
    model = decode_speed.build(dargs)
    batch, src_len = args.batch_size or 64, args.src_len or 24
    src = decode_speed.source_ids(batch, src_len, args.vocab_size)
    fn = decode_speed.make_decode_fn(model, dargs, args.decode_steps)
    run = lambda: [t.numpy() for t in fn(src)]
    run()
    beams = "greedy" if args.what == "greedy" else f"beam {args.beam_size}"
    return run, f"{beams} B={batch} S={src_len} steps={args.decode_steps}"


def translate_workload(args):
    """One `serving_default` call of a SavedModel translator on real sentences."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the graph)

    from tfxformer.serving import resolve_model_dir

    if not args.model or not args.text:
        raise SystemExit("--what translate needs --model (a SavedModel) and --text (a file).")
    _, path = resolve_model_dir(args.model)  # an export dir -> its highest version
    with open(args.text, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][:args.batch_size or 64]
    signature = tf.saved_model.load(path).signatures["serving_default"]
    text = tf.constant(lines)
    run = lambda: signature(text=text)["translation"].numpy()
    run()
    return run, f"translate {path} {len(lines)} sentences of {args.text}"


def op_events(logdir):
    """[(op name, op type, seconds)] of every TF op run in the newest trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(os.path.join(logdir, "plugins/profile/*/*.xplane.pb")))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:
                    continue
                name, op_type = name.rsplit(":", 1)
                if op_type not in CONTAINERS and not op_type.strip().startswith("__"):
                    events.append((name, op_type, event.duration_ps * 1e-12))
    return events


KERAS_SCOPES = ("transformer|encoder|decoder|layer_N|attention_block|self_attention_block|"
                "cross_attention_block|feed_forward_block|self_attention|cross_attention|"
                "feed_forward|inner|outer|norm|shared_embedding|positional_encoding|dropout")


def normalize(name):
    """Folds layer indices and Keras' scope suffixes (transformer_1 -> transformer)."""
    name = name.replace("StatefulPartitionedCall/", "")
    name = re.sub(r"while/body/_\d+/", "while/", name)
    name = re.sub(r"layer_\d+(_\d+)?", "layer_N", name)
    name = re.sub(r"dropout(_\d+)+", "dropout", name)
    return re.sub(rf"\b({KERAS_SCOPES})_\d+(?=/)", r"\1", name)


COMPONENTS = [  # (regex on the normalized lower-case name, component), first match wins
    (r"adam|(^|/)cond/|assignvariable|assignadd|assignsub", "optimizer update"),
    (r"/norm/|layer_normalization|moments|batchnorm", "layer norm"),
    (r"cross_attention", "decoder cross-attention"),
    (r"decoder/layer_n/self_attention", "decoder self-attention"),
    (r"encoder/layer_n/attention", "encoder self-attention"),
    (r"feed_forward", "feed-forward"),
    (r"dropout", "dropout (embeddings)"),
    (r"(^|/)(transformer|while)/matmul(/|$)", "vocab projection (tied logits)"),
    (r"unsortedsegmentsum|embedding|^(gradient_tape/)?(transformer/)?gatherv2", "embedding"),
    (r"^while/", "search loop (top-k, log-softmax, reorder gathers)"),
    (r"logsoftmax|exp|truediv|sum|mean|mul|sub|neg|gather", "loss over V"),
]
OP_CLASSES = [
    (r"matmul", "matmul"), (r"select|gather", "select/gather"), (r"softmax", "softmax"),
    (r"transpose|reshape|pack|concat|tile", "transpose/reshape"), (r"^(sum|mean)$", "reduce"),
    (r"random", "rng"),
]


def component(name, op_type):
    """'component · op class [fwd|bwd]' of one op."""
    lowered = name.lower()
    phase = "bwd" if "gradient_tape" in lowered else "fwd"
    label = next((lab for pat, lab in COMPONENTS if re.search(pat, lowered)), "other")
    if label == "optimizer update":
        return label
    op_class = next((c for pat, c in OP_CLASSES if re.search(pat, op_type.lower())),
                    "elementwise/other")
    return f"{label} · {op_class} [{phase}]"


def table(counter, total, steps, top, title):
    bl.log(f"\n{title}\n| | ms/step | % |\n|---|---|---|")
    rows = []
    for key, seconds in counter.most_common(top):
        rows.append({"key": key, "ms_per_step": round(1e3 * seconds / steps, 1),
                     "percent": round(100 * seconds / total, 1)})
        bl.log(f"| {key} | {rows[-1]['ms_per_step']} | {rows[-1]['percent']} |")
    return rows


def main(argv=None):
    import tensorflow as tf

    args = parse_args(argv)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    if args.patch:
        patches.apply(args.patch)
    run, what = workload(args)
    logdir = args.logdir or tempfile.mkdtemp(prefix="tfx_profile_")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for _ in range(args.steps):
        run()
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    events = op_events(logdir)
    total = sum(seconds for _, _, seconds in events)
    by_type, by_component, by_name = (collections.Counter() for _ in range(3))
    for name, op_type, seconds in events:
        by_type[op_type] += seconds
        by_component[component(normalize(name), op_type)] += seconds
        by_name[f"{normalize(name)} ({op_type})"] += seconds
    durations = sorted(seconds for _, _, seconds in events)
    median_us = 1e6 * durations[len(durations) // 2] if durations else 0.0
    bl.log(f"{what}: wall {1e3 * wall / args.steps:.0f} ms/step, summed op time "
           f"{1e3 * total / args.steps:.0f} ms/step over {len(events) // args.steps} op runs "
           f"(median op {median_us:.1f} us)")
    result = {"bench": "profile", "what": what, "preset": args.preset, "inter_op": args.inter_op,
              "patch": args.patch,
              "precision": args.precision, "steps": args.steps,
              "wall_ms_per_step": round(1e3 * wall / args.steps, 1),
              "op_ms_per_step": round(1e3 * total / args.steps, 1),
              "op_runs_per_step": len(events) // args.steps,
              "median_op_us": round(median_us, 1),
              "by_op_type": table(by_type, total, args.steps, args.top, "By op type"),
              "by_component": table(by_component, total, args.steps, 40, "By component"),
              "top_ops": table(by_name, total, args.steps, args.top, "Top ops"),
              "logdir": logdir}
    bl.emit({**result, "peak_rss_mib": bl.peak_rss_mib(), **bl.machine()})


if __name__ == "__main__":
    main()
