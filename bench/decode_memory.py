#!/usr/bin/env python
"""Where the peak RSS of beam-4 translation goes: resident memory after each stage.

The bench workload of decode_speed.py (base preset, random weights, 64 x 24 sources, beam
4, exactly 32 steps; same flags, e.g. --best, --precision bf16), measured stage by stage
in one process: the bare interpreter, `import tensorflow`, the model built (its weights),
the decode function traced (its graph built, nothing run), its first call, three more
calls, and then glibc's `malloc_trim(0)`, which hands freed heap pages back to the kernel: what it
returns was held by the allocator, not by live tensors. Resident memory is read from
/proc/self/statm; the peak (ru_maxrss) is printed beside it.

  python bench/decode_memory.py              # fp32
  python bench/decode_memory.py --best       # the best mode of decode_speed.py
  python bench/decode_memory.py --preset tiny --vocab-size 1000   # smoke test

The last line printed is one JSON object (MiB).
"""

from __future__ import annotations

import ctypes
import os
import sys


def rss_mib() -> float:
    """Resident set size now (statm's second field, pages)."""
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def malloc_trim() -> bool:
    """glibc's malloc_trim(0); False where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def main(argv=None):
    stages = {"python": rss_mib()}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import benchlib as bl
    import decode_speed as ds
    import tensorflow as tf  # noqa: F401 (the runtime's own footprint is a stage)

    stages["import_tensorflow"] = rss_mib()
    args = ds.parse_args(argv)
    model = ds.build(args)
    weights_mib = round(sum(v.numpy().nbytes for v in model.weights) / 2**20, 1)
    stages["model_built"] = rss_mib()
    steps = args.decode_steps
    src = ds.source_ids(args.batch_size, args.src_len, args.vocab_size)
    fn = ds.make_decode_fn(model, args, steps, ds.stand_in_table(args))
    fn.get_concrete_function(src)
    stages["traced"] = rss_mib()
    [t.numpy() for t in fn(src)]
    stages["first_call"] = rss_mib()
    peak_first = bl.peak_rss_mib()
    for _ in range(3):
        [t.numpy() for t in fn(src)]
    stages["after_4_calls"] = rss_mib()
    trimmed = malloc_trim()
    stages["after_malloc_trim"] = rss_mib() if trimmed else None
    deltas = {}
    names = list(stages)
    for before, after in zip(names, names[1:], strict=False):
        if stages[after] is not None and stages[before] is not None:
            deltas[after] = round(stages[after] - stages[before], 1)
    for name in names:
        print(f"{name:>20}: {stages[name]} MiB" + (f"  ({deltas[name]:+})" if name in deltas
                                                     else ""))
    bl.emit({"bench": "decode_memory", "preset": args.preset, "vocab_size": args.vocab_size,
             "precision": args.precision, "shortlist_size": args.shortlist_size,
             "best": ds.BEST if args.best else None, "batch_size": args.batch_size,
             "src_len": args.src_len, "decode_steps": steps, "beams": args.beam_size,
             "rss_mib": stages, "delta_mib": deltas, "weights_mib": weights_mib,
             "peak_rss_mib_after_first_call": peak_first, "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


if __name__ == "__main__":
    main()
