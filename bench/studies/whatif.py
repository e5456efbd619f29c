#!/usr/bin/env python
"""What a proposed fix would buy, measured end to end without editing tfxformer.

Conclusion: the fused loss was adopted in tfxformer (`Trainer(fused_loss=True)`), for memory, at no
cost in speed; `fused_topk` gave nothing measurable end to end. Kept to measure a new
patch of bench/patches.py the same way.

Builds the benchmark workload twice in one process: first with tfxformer as it is (traced
and warmed up), then with --patch applied (bench/patches.py: runtime replacements of
public tfxformer functions; a new model, traced after the patch). The two then alternate
call by call on the same inputs, so the ratio holds on a shared machine. The patches are
listed in bench/patches.py (`fused_loss`, `fused_topk`).

  python bench/studies/whatif.py --what train --patch fused_loss --steps 4
  python bench/studies/whatif.py --what beam --patch fused_topk --repeats 3
  python bench/studies/whatif.py --what beam --patch fused_topk --preset tiny --vocab-size 1000

Both variants live in one process: for training at the peers' batch (128 x 32) that needs
more memory than a 24 GiB machine has, so there use `train_speed.py --patch NAME` in a
process of its own instead, or --batch-size here.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import benchlib as bl  # noqa: E402
import decode_speed  # noqa: E402
import patches  # noqa: E402
import train_speed  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=["train", "beam", "greedy"], default="train")
    ap.add_argument("--patch", default="fused_topk",
                    help=f"comma-separated, from {', '.join(sorted(patches.PATCHES))}")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--precision", choices=sorted(bl.POLICIES), default="fp32")
    ap.add_argument("--steps", type=int, default=4, help="timed train steps per variant")
    ap.add_argument("--batch-size", type=int, default=128, help="training pairs per batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed decode calls per variant")
    ap.add_argument("--static-cache", action="store_true",
                    help="decode with the fixed-size cache (XLA's layout)")
    return ap.parse_args(argv)


def build(args):
    """A zero-argument function running one step / call of the workload (traced)."""
    if args.what == "train":
        targs = train_speed.parse_args(["--preset", args.preset,
                                        "--vocab-size", str(args.vocab_size)])
        _, _, step = train_speed.build_tfxformer(targs)
        batches = bl.fixed_batches(2, args.batch_size, vocab=args.vocab_size, seed=2)
        return lambda: step(*batches[1])
    dargs = decode_speed.parse_args(["--preset", args.preset, "--vocab-size",
                                     str(args.vocab_size)]
                                    + (["--greedy"] if args.what == "greedy" else [])
                                    + (["--static-cache"] if args.static_cache else []))
    model = decode_speed.build(dargs)
    src = decode_speed.source_ids(64, 24, args.vocab_size)
    fn = decode_speed.make_decode_fn(model, dargs, 32)
    run = lambda: [t.numpy() for t in fn(src)]
    return run


def _equal(a, b):
    """Whether the first outputs agree: equal ids (decoding) or losses within 1e-4 (train)."""
    import numpy as np

    if isinstance(a, float):
        return bool(abs(a - b) <= 1e-4 * max(1.0, abs(a)))
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def main(argv=None):
    args = parse_args(argv)
    bl.set_precision(args.precision)
    baseline = build(args)
    first = baseline()  # traces; the loss (train) or the (ids, lengths) (decoding)
    rss_baseline = bl.peak_rss_mib()
    patches.apply(args.patch)
    patched = build(args)
    same = _equal(first, patched())
    # The first call of the baseline after the second build is slow once (no retrace: the
    # patch cannot reach the baseline's traced graph), so one untimed round first.
    baseline()
    n = args.steps if args.what == "train" else args.repeats
    times = {"baseline": [], "patched": []}
    for _ in range(n):
        times["baseline"].append(bl.timed(baseline)[0])
        times["patched"].append(bl.timed(patched)[0])
    pairs = [b / p for b, p in zip(times["baseline"], times["patched"], strict=True)]
    result = {"bench": "whatif", "what": args.what, "patch": args.patch, "preset": args.preset,
              "batch_size": args.batch_size if args.what == "train" else 64,
              "precision": args.precision, "calls": n,
              "baseline_s": bl.spread(times["baseline"]), "patched_s": bl.spread(times["patched"]),
              "speedup_median": round(statistics.median(times["baseline"])
                                      / statistics.median(times["patched"]), 3),
              "speedup_best": round(min(times["baseline"]) / min(times["patched"]), 3),
              "speedup_per_pair": bl.spread(pairs),
              "baseline_s_all": [round(t, 3) for t in times["baseline"]],
              "patched_s_all": [round(t, 3) for t in times["patched"]],
              "same_first_output": same,
              "peak_rss_mib_after_baseline_warmup": rss_baseline,
              "peak_rss_mib": bl.peak_rss_mib()}
    bl.log(f"{args.what} with {args.patch}: same first output {same}; "
           f"x{result['speedup_median']} (medians), "
           f"x{result['speedup_best']} (best), per pair {result['speedup_per_pair']}")
    bl.emit({**result, **bl.machine()})


if __name__ == "__main__":
    main()
