"""What an export costs to make and to load: CPU seconds of `scripts/export.py`, the size of
its saved_model.pb, the resident memory a fresh process adds loading it (after `import
tensorflow, tensorflow_text`) and the CPU seconds of the load, and the memory after one
sentence through each of its beam-search signatures (serving_default,
translate_with_options, translate_per_example: those it has). Every figure comes from a
fresh process; the variants alternate `--repeats` times. The variants: one export per
set of `--signature-sets`, each exported with `scripts/export.py --signatures SET` ("all":
the default, every signature).

  taskset -c 0 python bench/export_cost.py --model saved_models/multi30k_en_de \\
      --signature-sets all serving_default "serving_default translate_per_example" \\
      --repeats 3 --work runs/export_signatures > bench/results/export_signatures.log
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import benchlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

EXPORT = """
import resource, runpy, sys
sys.argv = ["export.py", "--model", {model!r}, "--export-dir", {out!r}, *{flags!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as error:
    if error.code:
        raise
usage = resource.getrusage(resource.RUSAGE_SELF)
print("CPU", usage.ru_utime + usage.ru_stime)
"""

LOAD = """
import resource, time
import tensorflow as tf
import tensorflow_text  # noqa: F401 - the SentencePiece ops

def mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

before, cpu = mib(), time.process_time()
loaded = tf.saved_model.load({version!r})
after_load, cpu = mib(), time.process_time() - cpu
text = tf.constant(["A dog runs in the park."])
signatures = loaded.signatures
signatures["serving_default"](text=text)
if "translate_with_options" in signatures:
    signatures["translate_with_options"](text=text, beam_size=tf.constant(4),
                                         alpha=tf.constant(0.6), extra_length=tf.constant(50))
if "translate_per_example" in signatures:
    signatures["translate_per_example"](text=text, beam_size=tf.constant([4]),
                                        alpha=tf.constant([0.6]),
                                        extra_length=tf.constant([50]),
                                        max_input_tokens=tf.constant([128]))
print("MEM", after_load - before, mib() - before, cpu, len(signatures))
"""


def run(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return done.stdout.split()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="saved_models/multi30k_en_de",
                    help="what to export: any model dir scripts/export.py takes")
    ap.add_argument("--signature-sets", nargs="+", metavar="SET",
                    default=["all", "serving_default"],
                    help="one variant per set of signature names (space-separated in one "
                         "argument), exported with scripts/export.py --signatures SET; 'all' "
                         "for the default (default: all serving_default)")
    ap.add_argument("--repeats", type=int, default=2, help="passes of all variants")
    ap.add_argument("--work", default="runs/export_cost",
                    help="folder for the exports (emptied first)")
    args = ap.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    # variant name -> scripts/export.py flags
    variants = {"+".join(s.split()): [] if s == "all" else ["--signatures", *s.split()]
                for s in args.signature_sets}
    rows = {name: [] for name in variants}
    load_averages = [os.getloadavg()]
    for repeat in range(args.repeats):
        for name in (list(variants) if repeat % 2 == 0 else list(variants)[::-1]):
            flags = variants[name]
            out = os.path.abspath(os.path.join(args.work, f"{name}_{repeat}"))
            words = run(EXPORT.format(model=args.model, out=out,
                                      flags=flags,
                                      script=os.path.join(ROOT, "scripts", "export.py")))
            version = os.path.join(out, "1")
            loaded = run(LOAD.format(version=version))
            row = {"export_cpu_s": round(float(words[words.index("CPU") + 1]), 2),
                   "saved_model_pb_mb": round(os.path.getsize(
                       os.path.join(version, "saved_model.pb")) / 1e6, 2),
                   "signatures": int(loaded[4]),
                   "load_mib": round(float(loaded[1]), 1),
                   "load_cpu_s": round(float(loaded[3]), 2),
                   "load_and_beam_signatures_mib": round(float(loaded[2]), 1)}
            rows[name].append(row)
            load_averages.append(os.getloadavg())
            benchlib.log(f"{name} pass {repeat}: {json.dumps(row)} load {load_averages[-1][0]:.2f}")
    benchlib.emit({"bench": "export_cost", "model": args.model, "machine": benchlib.machine(),
                   "affinity": sorted(os.sched_getaffinity(0)),
                   "load_average": load_averages, "rows": rows})


if __name__ == "__main__":
    main()
