#!/usr/bin/env python
"""Peak memory (RSS) of tfxformer's training step on the peers' workload, with a breakdown.

The workload and step are train_speed.py's (`Trainer.train_step`, base preset, the peers'
fixed batches). Peak RSS is per process, so every variant runs in its own process:

  python bench/train_memory.py                          # fp32, the fused loss
  python bench/train_memory.py --compare fp32,bf16 --losses logits,fused   # one process each
  python bench/train_memory.py --preset tiny --vocab-size 1000 --steps 1   # smoke test

Reported (MiB): the process's peak RSS, the largest of the phases' peaks (VmHWM, and so
`ru_maxrss`, is reset through /proc/self/clear_refs before each phase; a thread samples
VmRSS as a check); RSS after each phase (imports, model, optimizer slots, first step,
warm-up, measured steps); TensorFlow's CPU allocator statistics per phase (none with
TF_ENABLE_ONEDNN_OPTS=0: the error instead); the step's big tensors; and a floor: weights,
gradients, Adam's slots, the activations backpropagation keeps, and the RSS before the
model existed. Allocator settings (ENV_KEYS) are echoed from the environment.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

import benchlib as bl

MIB = 2 ** 20
ENV_KEYS = ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TOP_PAD_", "TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS",
            "TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "LD_PRELOAD", "OMP_NUM_THREADS")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bl.workload_args(ap, batch_size=128, src_len=32, tgt_len=32)
    ap.add_argument("--loss", choices=["logits", "fused"], default="fused",
                    help="the Trainer's loss path: 'logits' = label-smoothed cross-entropy on "
                         "the (B, T, V) logits, 'fused' = projection and loss fused in row "
                         "chunks (Trainer(fused_loss=True), the default)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the measured ones "
                    "(the first traces the step)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra- and inter-op threads (0: TensorFlow's default, from the CPUs "
                         "the process may use: one under `taskset -c 1`)")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="VmRSS sampling period")
    ap.add_argument("--compare", default=None,
                    help="comma-separated precisions: run every (precision, loss) "
                         "combination in its own process and print a summary")
    ap.add_argument("--losses", default="fused",
                    help="with --compare: comma-separated --loss values")
    return ap.parse_args(argv)


# --- reading the process's memory ------------------------------------------------------

def status_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(match.group(1))


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Sampler(threading.Thread):
    """Samples VmRSS every `period` seconds; `peak` is the largest sample since `reset()`.

    TensorFlow releases the GIL while ops run, so the thread samples during a step too.
    """

    def __init__(self, period: float):
        super().__init__(daemon=True)
        self.period, self.peak, self.overall = period, 0, 0
        self._done = threading.Event()

    def reset(self):
        self.peak = 0

    def run(self):
        while not self._done.is_set():
            rss = status_kib("VmRSS")
            self.peak, self.overall = max(self.peak, rss), max(self.overall, rss)
            time.sleep(self.period)

    def stop(self):
        self._done.set()
        self.join()


class Phases:
    """RSS after each phase and the phase's own peak (VmHWM reset, and the sampler)."""

    def __init__(self, sampler: Sampler):
        self.sampler, self.rows, self.tf = sampler, [], None
        self.hwm_resets = reset_peak()
        sampler.reset()

    def track_allocator(self, tf):
        """Also report TensorFlow's allocator peak per phase (reset at each mark)."""
        self.tf = tf
        self._reset_allocator()

    def _reset_allocator(self):
        if self.tf is not None:
            try:
                self.tf.config.experimental.reset_memory_stats("CPU:0")
            except (ValueError, RuntimeError):
                self.tf = None  # no statistics on this allocator

    def mark(self, name: str, **extra):
        rss = status_kib("VmRSS")
        peak = status_kib("VmHWM") if self.hwm_resets else None
        self.rows.append({"phase": name, "rss_mib": round(rss / 1024, 1),
                          "phase_peak_mib": None if peak is None else round(peak / 1024, 1),
                          "phase_sampled_peak_mib": round(self.sampler.peak / 1024, 1),
                          **extra})
        if self.tf is not None:
            stats = allocator_stats(self.tf)
            self.rows[-1].update(allocator_in_use_mib=stats.get("current"),
                                 allocator_phase_peak_mib=stats.get("peak"))
        bl.log(f"{name:>22}: RSS {rss / 1024:8.1f} MiB, phase peak "
               f"{(peak or 0) / 1024:8.1f} MiB (sampled {self.sampler.peak / 1024:8.1f})")
        self.hwm_resets = reset_peak()
        self.sampler.reset()
        self._reset_allocator()

    def peak_mib(self) -> float:
        """The process's peak RSS: the largest phase peak. (Resetting VmHWM also resets
        the kernel's ru_maxrss to the RSS at the reset, so ru_maxrss alone would only
        cover the last phase.)"""
        peaks = [r["phase_peak_mib"] or r["phase_sampled_peak_mib"] for r in self.rows]
        return max([bl.peak_rss_mib(), *peaks])


def allocator_stats(tf) -> dict:
    """TensorFlow's CPU allocator statistics, or why there are none."""
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
        return {k: round(v / MIB, 1) for k, v in info.items()}
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}


# --- what the step holds -------------------------------------------------------------------

def big_tensors(config, batch, src, tgt, compute_bytes) -> dict:
    """Sizes (MiB) of the step's largest tensors, by what they are."""
    d, f, v = config["d_model"], config["d_ff"], config["vocab_size"]
    rows = batch * tgt
    return {
        "logits (B*T, V) float32": rows * v * 4 / MIB,
        "logits (B*T, V) compute dtype before the float32 cast": rows * v * compute_bytes / MIB,
        "log-softmax / softmax / their gradients (B*T, V) float32, each": rows * v * 4 / MIB,
        "embedding gradient, dense (V, D) float32": v * d * 4 / MIB,
        "embedding gradient of the lookups as IndexedSlices (B*(S+T), D)":
            batch * (src + tgt) * d * 4 / MIB,
        "feed-forward hidden (B*T, d_ff), each": rows * f * compute_bytes / MIB,
        "one (B*L, D) activation": rows * d * compute_bytes / MIB,
    }


def activation_floor(config, batch, src, tgt, compute_bytes) -> dict:
    """Activations backpropagation must keep, counted per layer (MiB): what the gradients
    of each op read (inputs of matmuls, softmax outputs, dropout masks, LayerNorm inputs,
    ReLU outputs). A lower bound of what TensorFlow keeps; no (B*T, V) tensor is counted
    (a fused loss needs none)."""
    d, f, h = config["d_model"], config["d_ff"], config["num_heads"]
    layers = config["num_layers"]
    src_rows, tgt_rows = batch * src, batch * tgt

    def attention(q_rows, kv_rows, q_len, kv_len):
        # x (for Q and K/V projections), q, k, v, context, the output-dropout mask
        # (1 byte), the LayerNorm input in float32, scores after softmax (B, H, Tq, Tk).
        vectors = (2 * q_rows + 2 * kv_rows + q_rows) * d * compute_bytes
        vectors += q_rows * d * (1 + 4)
        return vectors + batch * h * q_len * kv_len * compute_bytes

    def ffn(rows):
        # input, ReLU output (B*L, d_ff), output-dropout mask, LayerNorm input float32.
        return rows * d * compute_bytes + rows * f * compute_bytes + rows * d * (1 + 4)

    enc = attention(src_rows, src_rows, src, src) + ffn(src_rows)
    dec = (attention(tgt_rows, tgt_rows, tgt, tgt) + attention(tgt_rows, 0, tgt, src)
           + ffn(tgt_rows))
    memory_kv = 2 * src_rows * d * compute_bytes * layers  # cross-attention K, V per layer
    embeddings = (src_rows + tgt_rows) * d * (compute_bytes + 1)  # dropout inputs + masks
    final = tgt_rows * d * compute_bytes  # the decoder output, input of the projection
    return {"encoder_layer": enc / MIB, "decoder_layer": dec / MIB,
            "total": (layers * (enc + dec) + memory_kv + embeddings + final) / MIB}


def floor_mib(params, config, args, baseline_rss_mib) -> dict:
    compute_bytes = 2 if args.precision == "bf16" else 4
    weights = params * 4 / MIB  # float32 variables (mixed precision keeps float32 masters)
    acts = activation_floor(config, args.batch_size, args.src_len, args.tgt_len,
                            compute_bytes)
    # Under mixed precision the step also holds bf16 copies of the kernels it casts.
    casts = params * 2 / MIB if compute_bytes == 2 else 0.0
    total = baseline_rss_mib + 4 * weights + casts + acts["total"]
    return {"runtime_before_model_mib": baseline_rss_mib, "weights_mib": weights,
            "gradients_mib": weights, "adam_slots_mib": 2 * weights,
            "bf16_weight_copies_mib": casts, "activations_mib": acts["total"],
            "activations_per_encoder_layer_mib": acts["encoder_layer"],
            "activations_per_decoder_layer_mib": acts["decoder_layer"],
            "total_mib": total}


# --- one measured process -------------------------------------------------------------

def measure(args) -> dict:
    sampler = Sampler(args.sample_ms / 1000)
    sampler.start()
    phases = Phases(sampler)
    policy = bl.set_precision(args.precision)
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    phases.track_allocator(tf)
    phases.mark("import")
    import train_speed

    model, optimizer, strategy = train_speed.build_model(args)
    phases.mark("model built")
    from tfxformer.trainer import Trainer

    trainer = Trainer(model, optimizer, strategy, label_smoothing=0.1,
                      fused_loss=args.loss == "fused")
    phases.mark("optimizer slots", optimizer_variables=len(optimizer.variables))
    step = train_speed.trainer_step(trainer)
    warm = bl.fixed_batches(args.warmup, args.batch_size, args.src_len, args.tgt_len,
                            args.vocab_size, seed=1)
    meas = bl.fixed_batches(args.steps, args.batch_size, args.src_len, args.tgt_len,
                            args.vocab_size, seed=2)
    losses, seconds = [], []
    for i, b in enumerate(warm + meas):
        start = time.perf_counter()
        losses.append(float(step(*b)))
        seconds.append(time.perf_counter() - start)
        name = ("first step (trace + run)" if i == 0 else
                f"warm-up step {i + 1}" if i < len(warm) else f"step {i + 1 - len(warm)}")
        phases.mark(name, loss=round(losses[-1], 4))
    sampler.stop()
    compute_bytes = 2 if args.precision == "bf16" else 4
    measured = [r for r in phases.rows if r["phase"].startswith("step ")]
    baseline = phases.rows[0]["rss_mib"]
    floor = floor_mib(model.count_params(), model.model_config.to_dict(), args, baseline)
    peak = phases.peak_mib()
    return {
        "bench": "train_memory", "preset": args.preset, "vocab_size": args.vocab_size,
        "batch_size": args.batch_size, "src_len": args.src_len, "tgt_len": args.tgt_len,
        "precision": args.precision, "dtype_policy": policy,
        "loss": args.loss, "params": model.count_params(),
        "threads": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                    "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
                    "sched_cpus": len(os.sched_getaffinity(0))},
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "peak_rss_mib": peak, "peak_rss_gib": round(peak / 1024, 2),
        "ru_maxrss_mib_last_phase": bl.peak_rss_mib(),
        "sampled_peak_rss_mib": round(sampler.overall / 1024, 1),
        "measured_step_peak_mib": max((r["phase_peak_mib"] or r["phase_sampled_peak_mib"])
                                      for r in measured) if measured else None,
        "phases": phases.rows,
        "allocator_stats": allocator_stats(tf),
        "big_tensors_mib": {k: round(v, 1) for k, v in big_tensors(
            model.model_config.to_dict(), args.batch_size, args.src_len, args.tgt_len,
            compute_bytes).items()},
        "floor_mib": {k: round(v, 1) for k, v in floor.items()},
        "peak_over_floor_mib": round(peak - floor["total_mib"], 1),
        "losses": [round(x, 4) for x in losses],
        "step_s_not_a_speed_figure": [round(s, 1) for s in seconds],
        **bl.machine(),
    }


# --- several processes ---------------------------------------------------------------------

def compare(args, argv) -> dict:
    """Runs every (precision, loss) combination in a fresh process of this script."""
    passthrough, skip = [], False
    for item in argv:  # this script's own flags minus the --compare ones
        if skip:
            skip = False
            continue
        if item in ("--compare", "--losses", "--loss", "--precision"):
            skip = True
            continue
        if item.split("=")[0] in ("--compare", "--losses", "--loss", "--precision"):
            continue
        passthrough.append(item)
    runs = []
    for precision in args.compare.split(","):
        for loss in args.losses.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--precision", precision,
                   "--loss", loss, *passthrough]
            bl.log(f"--- {precision}, loss {loss}: {' '.join(cmd[1:])}")
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"run failed ({out.returncode}):\n{out.stdout[-2000:]}\n"
                                 f"{out.stderr[-4000:]}")
            result = json.loads(lines[-1])
            bl.log(f"    peak RSS {result['peak_rss_mib']} MiB, measured-step peak "
                   f"{result['measured_step_peak_mib']} MiB, losses {result['losses']}")
            runs.append({"precision": precision, "loss": result["loss"],
                         "peak_rss_mib": result["peak_rss_mib"],
                         "peak_rss_gib": result["peak_rss_gib"],
                         "measured_step_peak_mib": result["measured_step_peak_mib"],
                         "floor_mib": result["floor_mib"]["total_mib"],
                         "losses": result["losses"], "phases": result["phases"]})
    return {"bench": "train_memory_compare", "preset": args.preset,
            "runs": runs, **bl.machine()}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, "
                         f"{args.warmup}")
    if args.compare:
        bl.emit(compare(args, argv))
    else:
        bl.emit(measure(args))


if __name__ == "__main__":
    main()
