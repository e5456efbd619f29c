#!/usr/bin/env python
"""CTranslate2 peer of decode_speed.py, built without torch (a reference run beside ours).

The peers' CT2 figures (their `infer_ct2.py`) come from a random Marian model converted with
transformers + torch. This converts the same shape from tfxformer instead: the base preset
with Keras' initial weights (seed 0) and the vocabulary "<pad> <unk> <s> </s> t4 ..
t31999", by the package's exporter (as `scripts/export.py --format ctranslate2`) in a
process of --tf-python, so that this one (`pip install ctranslate2 numpy`) holds no
TensorFlow. Then it times `translate_batch` on 64 sources of 23 random tokens + "</s>",
beam 4, min = max decoding length 32 (no EOS stop), inter_threads 1, intra_threads 2, as
the peers did; median of --repeats calls after one warm-up call.

  python bench/ct2_peer.py --compute-type float32      # or int8
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

V, D = 32000, 512  # the base preset's d_model
TOKENS = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, V)]
MODEL_DIR = "/tmp/tfx_bench_ct2_base_tfxformer"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(path):
    """The base preset with Keras' initial weights (seed 0) as a CTranslate2 model at `path`,
    by the package's exporter (needs TensorFlow: the project's venv)."""
    import keras

    from tfxformer import pretrained
    from tfxformer.config import get_preset
    from tfxformer.models.transformer import Transformer
    from tfxformer.serving.ctranslate2_export import build_spec, save_spec

    keras.utils.set_random_seed(0)
    config = get_preset("base", vocab_size=V)
    model = Transformer(config)
    model.build()
    weights = {pretrained.weight_key(w.path): w.numpy() for w in model.weights}
    save_spec(build_spec(config, weights, TOKENS), path)


def build_in_project_venv(path, python):
    """Runs :func:`build` in a process of `python` (with TensorFlow and tfxformer)."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([python, os.path.abspath(__file__), "--role", "build",
                           "--model-dir", path], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"Converting the model with {python} failed ({done.returncode}); "
                 f"--tf-python names the project's python:\n{done.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compute-type", default="float32",
                    help="CTranslate2 compute_type, e.g. float32, int8 (default: float32)")
    ap.add_argument("--beams", type=int, default=4, help="beam size (default: 4)")
    ap.add_argument("--batch-size", type=int, default=64, help="sources (default: 64)")
    ap.add_argument("--src-len", type=int, default=24,
                    help="tokens a source, </s> included (default: 24)")
    ap.add_argument("--decode-steps", type=int, default=32,
                    help="tokens generated a sentence (default: 32)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed calls after one warm-up (default: 5)")
    ap.add_argument("--model-dir", default=None,
                    help=f"where the converted model lives (default: {MODEL_DIR})")
    ap.add_argument("--tf-python", default=os.path.join(REPO, ".venv", "bin", "python"),
                    help="python with TensorFlow and tfxformer, which converts the model "
                         "once (default: %(default)s)")
    ap.add_argument("--role", choices=["time", "build"], default="time",
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model_dir = args.model_dir or MODEL_DIR

    if args.role == "build":
        return build(args.model_dir)
    import ctranslate2

    if not os.path.exists(os.path.join(args.model_dir, "model.bin")):
        build_in_project_venv(args.model_dir, args.tf_python)
    translator = ctranslate2.Translator(args.model_dir, device="cpu",
                                        compute_type=args.compute_type, inter_threads=1,
                                        intra_threads=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, V, size=(args.batch_size, args.src_len - 1))
    source = [[TOKENS[i] for i in row] + ["</s>"] for row in ids]
    steps = args.decode_steps

    def call():
        return translator.translate_batch(source, beam_size=args.beams, max_batch_size=0,
                                          max_decoding_length=steps, min_decoding_length=steps)

    start = time.perf_counter()
    out = call()
    first = time.perf_counter() - start
    lengths = sorted({len(r.hypotheses[0]) for r in out})
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(json.dumps({
        "bench": "translate", "system": f"CTranslate2 {ctranslate2.__version__} (tfxformer "
        "base, random weights, tfxformer's exporter)", "compute_type": args.compute_type,
        "compute_type_resolved": translator.compute_type,
        "cpu_isa_env": os.environ.get("CT2_FORCE_CPU_ISA", "(auto)"), "beams": args.beams,
        "batch_size": args.batch_size, "src_len": args.src_len, "decode_steps": steps,
        "out_lengths": lengths, "first_call_s": round(first, 2), "repeats": len(times),
        "call_s": {"median": round(med, 3), "min": round(min(times), 3),
                   "max": round(max(times), 3)},
        "call_s_all": [round(t, 3) for t in times],
        "sentences_per_second": round(args.batch_size / med, 2),
        "sentences_per_second_best_call": round(args.batch_size / min(times), 2),
        "target_tokens_per_second": round(args.batch_size * steps / med, 1),
        "embedding_scale": math.sqrt(D),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "loadavg_1min_at_end": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
