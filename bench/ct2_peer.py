#!/usr/bin/env python
"""CTranslate2 peer of decode_speed.py, built without torch (a reference run beside ours).

The peers' CTranslate2 figures (their `infer_ct2.py`) come from a random Marian
model converted with transformers + torch. This script builds the same shape directly as a
`ctranslate2.specs.TransformerSpec` from numpy (seed 0): base dims, post-LN, ReLU,
sinusoidal positions, embeddings scaled by sqrt(d), one embedding matrix shared by source,
target and the output projection, biases everywhere, vocabulary "<unk> <s> </s> t3 ..
t31999". Then it times `translate_batch` on 64 sources of 24 tokens (23 random + "</s>")
with beam 4 and min = max decoding length 32 (no EOS stop), as the peers did:
inter_threads 1, intra_threads 2; median of --repeats calls after one warm-up call.

--vmap-size L turns on CTranslate2's vocabulary map (its dynamic vocabulary reduction,
`use_vmap=True`) with a stand-in of the same cost as decode_speed.py's --shortlist-size L:
one always-on line (empty source n-gram) holding the same pool of L - 4 ids (seed 0), so
every batch decodes over that pool plus CT2's <unk> <s> </s>, L - 1 tokens.

Needs only `pip install ctranslate2 numpy` (a separate venv is fine; no TensorFlow):
  python bench/ct2_peer.py --compute-type float32 [--beams 4|1]
  CT2_FORCE_CPU_ISA=AVX512 python bench/ct2_peer.py --compute-type int8
  python bench/ct2_peer.py --compute-type int8 --vmap-size 4547
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time

import benchlib as bl
import numpy as np

V, D, H, FF, N = 32000, 512, 8, 2048, 6
TOKENS = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, V)]
MODEL_DIR = "/tmp/tfx_bench_ct2_base_random"


def build(path):
    import ctranslate2
    from ctranslate2.specs import transformer_spec

    rng = np.random.default_rng(0)
    spec = transformer_spec.TransformerSpec.from_config(
        N, H, pre_norm=False, no_final_norm=True, activation=ctranslate2.specs.Activation.RELU)

    def linear(lin, out_dim, in_dim):
        lin.weight = rng.normal(0.0, in_dim ** -0.5, (out_dim, in_dim)).astype(np.float32)
        lin.bias = np.zeros(out_dim, np.float32)

    def norm(ln):
        ln.gamma, ln.beta = np.ones(D, np.float32), np.zeros(D, np.float32)

    embeddings = rng.normal(0.0, D ** -0.5, (V, D)).astype(np.float32)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings
    spec.decoder.projection.bias = np.zeros(V, np.float32)
    for layer in spec.encoder.layer:
        linear(layer.self_attention.linear[0], 3 * D, D)
        linear(layer.self_attention.linear[1], D, D)
        norm(layer.self_attention.layer_norm)
        linear(layer.ffn.linear_0, FF, D)
        linear(layer.ffn.linear_1, D, FF)
        norm(layer.ffn.layer_norm)
    for layer in spec.decoder.layer:
        linear(layer.self_attention.linear[0], 3 * D, D)
        linear(layer.self_attention.linear[1], D, D)
        norm(layer.self_attention.layer_norm)
        linear(layer.attention.linear[0], D, D)
        linear(layer.attention.linear[1], 2 * D, D)
        linear(layer.attention.linear[2], D, D)
        norm(layer.attention.layer_norm)
        linear(layer.ffn.linear_0, FF, D)
        linear(layer.ffn.linear_1, D, FF)
        norm(layer.ffn.layer_norm)
    spec.register_source_vocabulary(TOKENS)
    spec.register_target_vocabulary(TOKENS)

    class RandomConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    RandomConverter().convert(path, force=True)


def write_vmap(path, size):
    """vmap.txt in model dir `path`: one always-on line with decode_speed.py's stand-in
    shortlist pool (`benchlib.stand_in_pool`, the same seed)."""
    pool = bl.stand_in_pool(np.random.default_rng(0), V, size)
    with open(os.path.join(path, "vmap.txt"), "w", encoding="utf-8") as f:
        f.write("\t" + " ".join(TOKENS[i] for i in sorted(pool)) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compute-type", default="float32")
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model-dir", default=None,
                    help=f"where the converted model lives (default: {MODEL_DIR}, with "
                         "_vmap<L> appended for --vmap-size)")
    ap.add_argument("--vmap-size", type=int, default=None, metavar="L",
                    help="use a vocabulary map of L - 1 candidates (a stand-in of "
                         "decode_speed.py --shortlist-size L; default: none)")
    args = ap.parse_args()
    if args.vmap_size is not None and not 4 < args.vmap_size <= V:
        ap.error(f"--vmap-size must be in (4, {V}], got {args.vmap_size}.")
    if args.model_dir is None:
        args.model_dir = MODEL_DIR + ("" if args.vmap_size is None else f"_vmap{args.vmap_size}")

    import ctranslate2

    if not os.path.exists(os.path.join(args.model_dir, "model.bin")):
        build(args.model_dir)
    if args.vmap_size is not None:
        write_vmap(args.model_dir, args.vmap_size)
    translator = ctranslate2.Translator(args.model_dir, device="cpu",
                                        compute_type=args.compute_type, inter_threads=1,
                                        intra_threads=2)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, V, size=(args.batch_size, args.src_len - 1))
    source = [[TOKENS[i] for i in row] + ["</s>"] for row in ids]
    steps = args.decode_steps

    def call():
        return translator.translate_batch(source, beam_size=args.beams, max_batch_size=0,
                                          max_decoding_length=steps, min_decoding_length=steps,
                                          use_vmap=args.vmap_size is not None)

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
        "bench": "translate", "system": f"CTranslate2 {ctranslate2.__version__} (spec built "
        "from numpy)", "compute_type": args.compute_type,
        "compute_type_resolved": translator.compute_type,
        "cpu_isa_env": os.environ.get("CT2_FORCE_CPU_ISA", "(auto)"), "beams": args.beams,
        "vmap_size": args.vmap_size,
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
