#!/usr/bin/env python
"""Training-step throughput of tfxformer on the peers' workload (random weights).

The peers' workload (their RESULTS.md §2): base preset, vocabulary 32000, 128 pairs x 32/32
real tokens (their `bench_data.fixed_batches` ids: warm-up seed 1, measured seed 2), label
smoothing 0.1, the paper's Adam and warmup-4000 schedule. The step is
`Trainer.train_step` under the 1-replica strategy of `make_strategy()`, each step timed on
its own; figures are medians over --steps.

  python bench/train_speed.py --peer keras-hub [--precision bf16]
  python bench/train_speed.py --peer logits-loss             # fused loss vs loss on logits
  python bench/train_speed.py --preset tiny --vocab-size 1000 --steps 3   # smoke test

With --peer the two alternate step by step after their warm-ups, so a shared machine's
drift hits both; the ratio is tfxformer's median over the peer's. `logits-loss` is a second
Trainer (fused_loss=False) on the same model and optimizer.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time

import benchlib as bl
import flops


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bl.workload_args(ap, batch_size=128, src_len=32, tgt_len=32)
    ap.add_argument("--steps", type=int, default=10, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (tracing, XLA)")
    ap.add_argument("--peer", choices=["keras-hub", "logits-loss"], default=None,
                    help="also run this peer on the same batches, alternating steps "
                         "(logits-loss: tfxformer with Trainer(fused_loss=False))")
    return ap.parse_args(argv)


def build_model(args):
    """(model, optimizer, strategy): the preset under make_strategy(), seed 0, the paper's
    Adam with the warmup-4000 schedule (also bench/train_memory.py's)."""
    import keras

    from tfxformer import Transformer, TransformerSchedule, paper_adam
    from tfxformer.distribute import make_strategy

    strategy = make_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
        model.build()
        optimizer = paper_adam(TransformerSchedule(model.model_config.d_model, 4000))
    return model, optimizer, strategy


def trainer_step(trainer):
    """Trainer.train_step as a function of (src, tgt_in, tgt) numpy ids -> loss (a float)
    (also bench/train_memory.py's)."""
    import tensorflow as tf

    def step(src, tgt_in, tgt):
        batch = ((tf.constant(src, tf.int32), tf.constant(tgt_in, tf.int32)),
                 tf.constant(tgt, tf.int32))
        return trainer.train_step(iter([batch]))["loss"]
    return step


def build_steps(args):
    """(model config, parameter count, tfxformer's real train step, and the step with the
    loss on the logits (`Trainer(fused_loss=False)`) on the same model and optimizer for
    `--peer logits-loss`, else None)."""
    from tfxformer.trainer import Trainer

    model, optimizer, strategy = build_model(args)

    def step_of(fused):
        return trainer_step(Trainer(model, optimizer, strategy, label_smoothing=0.1,
                                    fused_loss=fused))

    logits_step = step_of(False) if args.peer == "logits-loss" else None
    return (model.model_config.to_dict(), model.count_params(), step_of(True),
            logits_step)


def measure(step, warm, meas, peer_step=None):
    """Warm-up, then timed steps (alternating with `peer_step` if given)."""
    start = time.perf_counter()
    for b in warm:
        step(*b)
    warm_s = time.perf_counter() - start
    rss = bl.peak_rss_mib()
    peer_warm_s = None
    if peer_step is not None:
        start = time.perf_counter()
        for b in warm:
            peer_step(*b)
        peer_warm_s = time.perf_counter() - start
    times, peer_times, losses, peer_losses = [], [], [], []
    for b in meas:
        seconds, loss = bl.timed(step, *b)
        times.append(seconds)
        losses.append(loss)
        if peer_step is not None:
            seconds, loss = bl.timed(peer_step, *b)
            peer_times.append(seconds)
            peer_losses.append(loss)
    return dict(warm_s=warm_s, rss=rss, times=times, losses=losses, peer_warm_s=peer_warm_s,
                peer_times=peer_times, peer_losses=peer_losses)


def summary(times, losses, tokens, step_flops, warm_s):
    med = statistics.median(times)
    return {
        "warmup_s": round(warm_s, 1),
        "step_s": bl.spread(times),
        "target_tokens_per_second": round(tokens / med, 1),
        "target_tokens_per_second_min_max": [round(tokens / max(times), 1),
                                             round(tokens / min(times), 1)],
        "gflop_per_s": round(step_flops / med / 1e9, 1),
        "mfu": round(step_flops / med / 1e9 / flops.PEAK_GFLOPS, 3),
        # The fastest step is the least disturbed by other processes on a shared machine.
        "target_tokens_per_second_best_step": round(tokens / min(times), 1),
        "mfu_best_step": round(step_flops / min(times) / 1e9 / flops.PEAK_GFLOPS, 3),
        "step_s_all": [round(t, 2) for t in times],
        "loss_first_last": [round(losses[0], 3), round(losses[-1], 3)],
    }


def run_one(args, step, config, batch, src_len, tgt_len, peer_step=None):
    warm = bl.fixed_batches(args.warmup, batch, src_len, tgt_len, args.vocab_size, seed=1)
    meas = bl.fixed_batches(args.steps, batch, src_len, tgt_len, args.vocab_size, seed=2)
    step_flops = flops.train_step_flops(batch, src_len, tgt_len, **flops.model_flop_kwargs(config))
    tokens = batch * tgt_len
    m = measure(step, warm, meas, peer_step)
    out = {"batch_size": batch, "src_len": src_len, "tgt_len": tgt_len,
           "target_tokens_per_step": tokens, "gflop_per_step": round(step_flops / 1e9, 1),
           **summary(m["times"], m["losses"], tokens, step_flops, m["warm_s"]),
           "peak_rss_mib": m["rss"]}
    if peer_step is not None:
        peer = summary(m["peer_times"], m["peer_losses"], tokens, step_flops, m["peer_warm_s"])
        out["peer"] = peer
        # tfxformer speed / peer speed: of the medians, of the best steps, and per pair
        # of consecutive steps (the two steps of a pair share the machine's load).
        pairs = [p / t for t, p in zip(m["times"], m["peer_times"], strict=True)]
        out["ratio_vs_peer"] = round(
            out["target_tokens_per_second"] / peer["target_tokens_per_second"], 3)
        out["ratio_vs_peer_best_step"] = round(min(m["peer_times"]) / min(m["times"]), 3)
        out["ratio_vs_peer_per_step_pairs"] = bl.spread(pairs)
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    policy = bl.set_precision(args.precision)
    config, params, step, peer_step = build_steps(args)
    peer_name = "tfxformer, loss on the logits" if peer_step is not None else None
    if args.peer == "keras-hub":
        from kerashub_peer import make_train_step

        peer_model, peer_step = make_train_step(config)
        peer_name = peer_model.peer_name

    head = {"bench": "train", "system": "tfxformer Trainer.train_step (MirroredStrategy, 1 "
            "replica)", "preset": args.preset, "vocab_size": args.vocab_size, "params": params,
            "precision": args.precision, "dtype_policy": policy,
            "steps": args.steps, "warmup_steps": args.warmup,
            "peer_system": peer_name,
            "peak_gflops_for_mfu": flops.PEAK_GFLOPS}
    row = run_one(args, step, config, args.batch_size, args.src_len, args.tgt_len,
                  peer_step)
    if peer_step is not None:
        bl.log(f"tfxformer {row['target_tokens_per_second']} tgt tok/s, "
               f"{peer_name} {row['peer']['target_tokens_per_second']} tgt tok/s (medians)"
               f": ratio {row['ratio_vs_peer']}; best steps {row['ratio_vs_peer_best_step']}"
               f"; per-pair median {row['ratio_vs_peer_per_step_pairs']['median']}")
        row["peak_rss_mib_with_peer"] = bl.peak_rss_mib()
    result = {**head, "mode": "fixed", **row}
    bl.emit({**result, **bl.machine()})


if __name__ == "__main__":
    main()
