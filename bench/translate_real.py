#!/usr/bin/env python
"""Real-text translation benchmark: the shipped EN→DE model against CTranslate2 on its weights.

Systems, each run in its own process (so that `ru_maxrss` is its own peak RSS):
  tfxformer-fp32  the shipped SavedModel (saved_models/multi30k_en_de, highest version),
                  strings in, strings out, through `serving_default`.
  tfxformer-best  the same variables re-exported at run time with today's code
                  (`scripts/export.py --precision fp32`, --best-precision) into a temp dir,
                  same signature. fp32 because it was the fastest measured on this CPU:
                  bf16 (AVX512-BF16) no faster on test_2016 and slower on newstest2014 for
                  this d_model=128 model; Keras int8 slower than fp32
                  (bench/results/keras_quantize.log). See bench/README.md.
                  --best-shortlist K,N adds a vocabulary shortlist to it.
  tfxformer-shortlist  the same variables re-exported at fp32 with a vocabulary shortlist
                  (`scripts/export.py --shortlist K,N`, --shortlist, default 20,1000; the
                  table from the model's training data, multi30k train.en/train.de): the
                  shortlist lever alone, same signature (docs/serving.md, "Vocabulary shortlist").
  ct2-float32,    the same trained weights converted to CTranslate2 with its Python
  ct2-int8        `ctranslate2.specs` API from numpy (as bench/ct2_peer.py does for random
                  weights), loaded with compute_type float32 / int8.

The conversion (`build_ct2`): post-norm, ReLU, embeddings scaled by sqrt(d) (§3.4), one
matrix for source and target embeddings and the output projection (bias 0), LayerNorm
epsilon from config.json (1e-6), fused QKV / KV weights (Dense kernels transposed to CT2's
(out, in)), and the position table given explicitly: ours interleaves sin/cos (§3.5,
tfxformer/layers/position.py, positions from 0, angle pos / 10000^(2i/d)) while CT2's
built-in table (src/layers/common.cc, generate_sinusoidal_position_encoding) is [sin | cos]
halves, positions from 1, angle pos / 10000^(i/(d/2 - 1)); so `sinusoid_table` (numpy, our
formula) is stored as `position_encodings.encodings`, which CT2 indexes from position 0.
Vocabulary: the SentencePiece pieces of assets/spm.model in id order (<pad> <unk> <s> </s>
...: CT2's default unk/bos/eos names; decoding starts with <s>).
SentencePiece stays outside CT2: sources are encoded to pieces, cut to max_input_tokens - 1,
then "</s>" (as our translator does); output pieces are decoded with SentencePiece.
Decoding options as ours: the SavedModel's beam size and α (its assets/config.json
`decoding`, what serving_default runs: beam 4, α 0.6 for version 2, α 1.4 for version 3)
as CT2's `beam_size` and `length_penalty` (CT2 divides by ((5 + |Y|) / 6)^α
with |Y| counting the EOS, as tfxformer.decoding.length_penalty does), <pad> and <s> never
generated (`suppress_sequences`), sentences sorted by length in batches of 64, each batch's
`max_decoding_length` = min(max_output_tokens, longest source + extra_length) (ours is per
sentence; equal while no output runs past its own source + 50).

Timing: per system, set, mode and batch size, one untimed warm-up call on the first 64
sentences, then --repeats passes over the whole set; sentences/s and target tokens/s
(SentencePiece pieces of the output text, EOS not counted, the same count for every system)
over the median pass: the machine's throughput; cased sacreBLEU (13a).
Threads (--modes): every worker is pinned to --cpus (default: all). single: one call (TF:
the whole set, which the translator sorts and decodes in chunks of its batch size) or one
batch (CT2) at a time, CT2 intra_threads = --threads (default: the number of those cores),
inter_threads 1, TensorFlow its default pools (sized from the same affinity mask).
concurrent: each system at its serving setting: the set sorted by length and cut into
batches of --batch-sizes S; TF: one caller thread per core, each calling serving_default
on its own batches, intra-op parallelism 1, inter-op threads = cores (TF Serving's CPU
setting: num_batch_threads = cores, --tensorflow_intra_op_parallelism=1); CT2: every batch
submitted asynchronously, inter_threads = cores, intra_threads 1. On a machine where
another job holds a core, pin both sides to the free ones: CT2 with more threads than free
cores stalls (64 sentences, core 0 busy with a training: 37.5 s and 50.6 s with 2 threads
vs 0.18 s with 1; bench/results/translate_real.log).

Environments: the TF part runs in the project venv (PYTHONPATH = repo root), the CT2 part
in its own venv, no TensorFlow, named by --ct2-python or TFXFORMER_CT2_PYTHON:
  python3.11 -m venv CT2_VENV
  CT2_VENV/bin/pip install ctranslate2 sentencepiece numpy sacrebleu
  export TFXFORMER_CT2_PYTHON=CT2_VENV/bin/python
Run (from the repo root, with the project's python):
  PYTHONPATH=$PWD python bench/translate_real.py [--limit N] [--sets ...] [--systems ...] \
      [--modes single concurrent] [--batch-sizes 16 64 256] [--ct2-python CT2_VENV/bin/python]
Prints one JSON line per system, set, mode and batch size: {"system", "set", "mode",
"batch_size", "sentences_per_second",
"target_tokens_per_second", "bleu", "peak_rss_mib"}; details go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data")
EXPORT_DIR = os.path.join(REPO, "saved_models", "multi30k_en_de")
SYSTEMS = ("tfxformer-fp32", "tfxformer-best", "tfxformer-shortlist", "ct2-float32",
           "ct2-int8")
DEFAULT_SHORTLIST = "20,1000"  # BLEU 0.07 below the full vocabulary (docs/serving.md)
MODES = ("single", "concurrent")
SETS = {"test_2016_flickr": ("multi30k", "test_2016_flickr"),
        "newstest2014": ("wmt14", "newstest2014")}
BEAM, ALPHA, BATCH = 4, 0.6, 64
WARMUP = 64
AGREEMENT_BLEU = 0.3


def sinusoid_table(positions: int, d_model: int) -> np.ndarray:
    """(positions, d_model) float32 table, sine and cosine interleaved as §3.5 writes it:
    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    angles = (np.arange(positions, dtype=np.float32)[:, None]
              / np.power(np.float32(10000.0),
                         np.arange(0, d_model, 2, dtype=np.float32) / np.float32(d_model)))
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(positions, d_model)


def latest_version(export_dir: str) -> str:
    versions = [int(v) for v in os.listdir(export_dir) if v.isdigit()]
    if not versions:
        raise FileNotFoundError(f"No numbered SavedModel version in {export_dir!r}.")
    return os.path.join(export_dir, str(max(versions)))


def export_npz(model_dir: str, path: str) -> None:
    """The SavedModel's variables (key: Keras path, no ":0") and its config.json (key
    "config.json") into one .npz. Needs TensorFlow (and tensorflow-text for its ops)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

    loaded = tf.saved_model.load(model_dir)
    arrays = {v.name.rsplit(":", 1)[0]: v.numpy() for v in loaded.model_variables}
    with open(os.path.join(model_dir, "assets", "config.json")) as f:
        arrays["config.json"] = np.array(f.read())
    np.savez(path, **arrays)


def set_ct2_layer(spec_layer, weights, prefix, norm_name, kind):
    """One encoder/decoder layer of the CT2 spec from the npz weights under `prefix`."""
    def dense(lin, *names):  # our kernels are (in, out); CT2 wants (out, in)
        lin.weight = np.concatenate([weights[f"{prefix}/{n}_kernel"].T for n in names], 0)
        lin.bias = np.concatenate([weights[f"{prefix}/{n}_bias"] for n in names], 0)

    def norm(ln, block):
        ln.gamma = weights[f"{prefix}/{block}/norm/gamma"]
        ln.beta = weights[f"{prefix}/{block}/norm/beta"]

    att = spec_layer.self_attention
    dense(att.linear[0], "self_attention/query", "self_attention/key", "self_attention/value")
    dense(att.linear[1], "self_attention/output")
    norm(att.layer_norm, norm_name)
    if kind == "decoder":
        cross = spec_layer.attention
        dense(cross.linear[0], "cross_attention/query")
        dense(cross.linear[1], "cross_attention/key", "cross_attention/value")
        dense(cross.linear[2], "cross_attention/output")
        norm(cross.layer_norm, "cross_attention_block")
    ffn = spec_layer.ffn
    ffn.linear_0.weight = weights[f"{prefix}/feed_forward/inner/kernel"].T
    ffn.linear_0.bias = weights[f"{prefix}/feed_forward/inner/bias"]
    ffn.linear_1.weight = weights[f"{prefix}/feed_forward/outer/kernel"].T
    ffn.linear_1.bias = weights[f"{prefix}/feed_forward/outer/bias"]
    norm(ffn.layer_norm, "feed_forward_block")


def build_ct2(npz_path: str, spm_path: str, out_dir: str) -> None:
    """Converts the npz of `export_npz` to a CTranslate2 model directory (CT2 venv)."""
    import ctranslate2
    import sentencepiece
    from ctranslate2.specs import transformer_spec

    weights = dict(np.load(npz_path))
    model = json.loads(str(weights.pop("config.json")))["model"]
    if model.get("norm_first") or model.get("position_embedding", "sinusoidal") != "sinusoidal":
        raise ValueError(f"Only post-norm sinusoidal models convert, got {model}.")
    layers, d_model = model["num_layers"], model["d_model"]
    spec = transformer_spec.TransformerSpec.from_config(
        layers, model["num_heads"], pre_norm=False, no_final_norm=True,
        activation=ctranslate2.specs.Activation.RELU)
    spec.config.layer_norm_epsilon = float(model["layer_norm_epsilon"])
    embeddings = weights["transformer/shared_embedding/embeddings"]
    table = sinusoid_table(int(model.get("max_length", 1024)), d_model)
    spec.encoder.embeddings[0].weight = embeddings
    spec.decoder.embeddings.weight = embeddings
    spec.decoder.projection.weight = embeddings
    spec.decoder.projection.bias = np.zeros(embeddings.shape[0], np.float32)
    spec.encoder.position_encodings.encodings = table
    spec.decoder.position_encodings.encodings = table
    for i in range(layers):
        set_ct2_layer(spec.encoder.layer[i], weights, f"transformer/encoder/layer_{i}",
                   "attention_block", "encoder")
        set_ct2_layer(spec.decoder.layer[i], weights, f"transformer/decoder/layer_{i}",
                   "self_attention_block", "decoder")
    sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if pieces[:4] != ["<pad>", "<unk>", "<s>", "</s>"] or len(pieces) != embeddings.shape[0]:
        raise ValueError(f"Unexpected vocabulary: {pieces[:4]}, {len(pieces)} pieces for "
                         f"{embeddings.shape[0]} embeddings.")
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)

    class NumpyConverter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    NumpyConverter().convert(out_dir, force=True)


def read_set(name: str, limit: int | None):
    folder, stem = SETS[name]
    with open(os.path.join(DATA, folder, f"{stem}.en")) as f:
        sources = [line.rstrip("\n") for line in f][:limit]
    with open(os.path.join(DATA, folder, f"{stem}.de")) as f:
        references = [line.rstrip("\n") for line in f][: len(sources)]
    return sources, references


def _timed(fn, repeats):
    """(median seconds of `repeats` calls, every call's seconds, the last call's result)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], [round(t, 2) for t in times], result


def _report(args, hypotheses, references, seconds, sp, extra):
    import sacrebleu

    tokens = sum(len(sp.encode(h)) for h in hypotheses)
    row = {"system": args.system, "set": args.set, "mode": args.mode,
           "batch_size": args.batch_size,
           "sentences_per_second": round(len(hypotheses) / seconds, 2),
           "target_tokens_per_second": round(tokens / seconds, 1),
           "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    detail = {"sentences": len(hypotheses), "target_tokens": tokens, "seconds": round(seconds, 2),
              "loadavg_1min_at_end": round(os.getloadavg()[0], 2), **extra}
    if args.hypotheses:
        with open(args.hypotheses, "w") as f:
            f.write("\n".join(hypotheses) + "\n")
    print(json.dumps({"result": row, "detail": detail}), flush=True)


def length_chunks(lengths, size):
    """Indices of the sentences sorted by `lengths`, in calls of at most `size` (the way
    a client that batches by length, or a batching server, groups them)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[b: b + size] for b in range(0, len(order), size)]


def run_calls(translate_chunk, chunks, workers):
    """Hypotheses in input order: `translate_chunk(indices) -> texts` on every chunk, by
    `workers` callers at once (1: one after the other)."""
    total = sum(len(c) for c in chunks)
    output = [None] * total
    if workers == 1:
        results = map(translate_chunk, chunks)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(translate_chunk, chunks))
    for rows, texts in zip(chunks, results, strict=True):
        for i, text in zip(rows, texts, strict=True):
            output[i] = text
    return output


def tf_worker(args):
    """Translates one set through `serving_default` of args.model.

    single: the whole set in one call (the translator sorts it by length and decodes it in
    chunks of its export's batch size), TensorFlow's default thread pools. concurrent: the
    set sorted by length and cut into calls of --batch-size sentences, one caller per core
    at once, intra-op parallelism 1 and one inter-op thread per core: TF Serving's CPU
    setting (num_batch_threads = cores, --tensorflow_intra_op_parallelism=1).
    """
    import sentencepiece
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    workers = len(args.cpu_set) if args.mode == "concurrent" else 1
    if args.mode == "concurrent":
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(workers)
    sources, references = read_set(args.set, args.limit)
    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(args.model, "assets", "spm.model"))
    fn = tf.saved_model.load(args.model).signatures["serving_default"]
    fn(text=tf.constant(sources[:WARMUP]))
    truncated = []

    def translate_chunk(rows):
        out = fn(text=tf.constant([sources[i] for i in rows]))
        truncated.append(int(out["truncated"].numpy().sum()))
        return [t.decode("utf-8") for t in out["translation"].numpy()]

    if args.mode == "single":
        chunks = [list(range(len(sources)))]
    else:
        chunks = length_chunks([len(sp.encode(line)) for line in sources], args.batch_size)
    seconds, times, hypotheses = _timed(
        lambda: run_calls(translate_chunk, chunks, workers), args.repeats)
    _report(args, hypotheses, references, seconds, sp,
            {"model": os.path.relpath(args.model, REPO) if args.model.startswith(REPO)
             else args.model, "truncated": sum(truncated[-len(chunks):]),
             "seconds_all": times, "callers": workers,
             "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
             "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()})


def ct2_worker(args):
    """Translates one set with the CT2 model of args.ct2_dir (CT2 venv).

    The set sorted by length, in batches of --batch-size sentences. single: one batch
    after the other, intra_threads = --threads, inter_threads 1. concurrent: every batch
    submitted at once (`asynchronous=True`), inter_threads = cores, intra_threads 1: the
    setting CTranslate2 recommends for throughput on a CPU.
    """
    import ctranslate2
    import sentencepiece

    with open(args.limits) as f:
        limits = json.load(f)
    sources, references = read_set(args.set, args.limit)
    sp = sentencepiece.SentencePieceProcessor(model_file=args.spm)
    concurrent = args.mode == "concurrent"
    inter, intra = (len(args.cpu_set), 1) if concurrent else (1, args.threads)
    translator = ctranslate2.Translator(
        args.ct2_dir, device="cpu", compute_type=args.system.split("-", 1)[1],
        inter_threads=inter, intra_threads=intra)

    def translate(lines):
        tokens = [sp.encode(line, out_type=str)[: limits["max_input_tokens"] - 1] + ["</s>"]
                  for line in lines]
        chunks = length_chunks([len(t) for t in tokens], args.batch_size)
        pending = []
        for rows in chunks:
            longest = max(len(tokens[i]) for i in rows)
            results = translator.translate_batch(
                [tokens[i] for i in rows], beam_size=limits["beam_size"],
                length_penalty=limits["alpha"], asynchronous=concurrent,
                max_batch_size=0, max_input_length=0, suppress_sequences=[["<pad>"], ["<s>"]],
                max_decoding_length=min(limits["max_output_tokens"],
                                        longest + limits["extra_length"]))
            pending.append((rows, results))
        output = [None] * len(tokens)
        for rows, results in pending:
            for i, r in zip(rows, results, strict=True):
                output[i] = sp.decode_pieces((r.result() if concurrent else r).hypotheses[0])
        return output

    translate(sources[:WARMUP])
    seconds, times, hypotheses = _timed(lambda: translate(sources), args.repeats)
    _report(args, hypotheses, references, seconds, sp,
            {"ct2_version": ctranslate2.__version__, "seconds_all": times,
             "compute_type_resolved": translator.compute_type, "intra_threads": intra,
             "inter_threads": inter,
             "cpu_isa_env": os.environ.get("CT2_FORCE_CPU_ISA", "(auto)")})


def log(message):
    print(f"[translate_real {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(cmd, env=None):
    log(" ".join(cmd))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{cmd[:4]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def prepare(args, tmp):
    """npz, CT2 model dir and the re-exports (per system and batch size), each made in its
    own process; -> paths."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    paths = {"fp32": args.model, "spm": os.path.join(args.model, "assets", "spm.model"),
             "ct2": os.path.join(tmp, "ct2"), "limits": os.path.join(tmp, "limits.json")}
    with open(os.path.join(args.model, "assets", "config.json")) as f:
        decoding = json.load(f)["decoding"]
    limits = {k: decoding[k] for k in ("max_input_tokens", "max_output_tokens", "extra_length")}
    # CT2 decodes with the SavedModel's own beam size and length penalty (serving_default's)
    limits.update(beam_size=decoding.get("beam_size", BEAM), alpha=decoding.get("alpha", ALPHA))
    with open(paths["limits"], "w") as f:
        json.dump(limits, f)
    if any(s.startswith("ct2") for s in args.systems):
        npz = os.path.join(tmp, "weights.npz")
        _run([args.tf_python, __file__, "--role", "npz", "--model", args.model, "--out", npz],
             env)
        _run([args.ct2_python, __file__, "--role", "ct2-build", "--npz", npz,
              "--spm", paths["spm"], "--out", paths["ct2"]])
    exports = {"tfxformer-fp32": ("fp32", "fp32", None),
               "tfxformer-best": ("best", args.best_precision, args.best_shortlist),
               "tfxformer-shortlist": ("shortlist", "fp32", args.shortlist)}
    for system, (name, precision, shortlist) in exports.items():
        if system not in args.systems:
            continue
        for size in args.batch_sizes:
            if name == "fp32" and size == decoding.get("batch_size", BATCH):
                paths[name, size] = args.model  # the shipped export as it is
                continue
            paths[name, size] = _export(args, env, os.path.join(tmp, f"{name}_{size}"),
                                        precision, shortlist, size, limits)
    log(f"limits {limits}")
    return paths, env


def _export(args, env, export_dir, precision, shortlist, batch_size, limits):
    """The model's variables re-exported with these options; -> the version dir."""
    flags = ["--shortlist", shortlist, "--shortlist-data",
             os.path.join(DATA, "multi30k")] if shortlist else []
    out = _run([args.tf_python, os.path.join(REPO, "scripts", "export.py"), "--model",
                args.model, "--export-dir", export_dir, "--precision", precision,
                "--batch-size", str(batch_size),
                "--max-input-tokens", str(limits["max_input_tokens"]),
                "--max-output-tokens", str(limits["max_output_tokens"]),
                "--extra-length", str(limits["extra_length"]), *flags], env)
    return out.strip().splitlines()[-1]


def drive(args):
    """Runs every (set, system) in its own process; prints the result lines."""
    log(f"uptime before: {_uptime()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfx_translate_real_") as tmp:
        paths, env = prepare(args, tmp)
        if args.hypotheses_dir:
            os.makedirs(args.hypotheses_dir, exist_ok=True)
        runs = [(name, mode, size, system) for name in args.sets for mode in args.modes
                for size in args.batch_sizes for system in args.systems]
        for name, mode, size, system in runs:
            hyp = os.path.join(args.hypotheses_dir or tmp,
                               f"{system}.{mode}.{size}.{name}.txt")
            common = ["--role", "worker", "--system", system, "--set", name,
                      "--hypotheses", hyp, "--repeats", str(args.repeats), "--modes", mode,
                      "--batch-sizes", str(size)]
            common += ["--limit", str(args.limit)] if args.limit else []
            common += ["--cpus", args.cpus] if args.cpus else []
            if system.startswith("ct2"):
                cmd = [args.ct2_python, __file__, *common, "--ct2-dir", paths["ct2"],
                       "--spm", paths["spm"], "--limits", paths["limits"],
                       "--threads", str(args.threads)]
            else:
                cmd = [args.tf_python, __file__, *common, "--model",
                       paths[system.split("-", 1)[1], size]]
            out = json.loads(_run(cmd, env).strip().splitlines()[-1])
            log(f"detail {system} {name}: {json.dumps(out['detail'])}")
            print(json.dumps(out["result"]), flush=True)
            rows.append(out["result"])
    log(f"uptime after: {_uptime()}")
    check_agreement(rows)


def check_agreement(rows):
    """fp32 tfxformer and fp32 CT2 agree within AGREEMENT_BLEU on test_2016, for each mode
    and batch size run (else exit 1)."""
    bleu = {}
    for r in rows:
        if r["set"] == "test_2016_flickr":
            bleu.setdefault((r["mode"], r["batch_size"]), {})[r["system"]] = r["bleu"]
    for setting, by_system in bleu.items():
        if "tfxformer-fp32" in by_system and "ct2-float32" in by_system:
            gap = abs(by_system["tfxformer-fp32"] - by_system["ct2-float32"])
            log(f"test_2016 BLEU gap tfxformer-fp32 vs ct2-float32 at {setting}: {gap:.2f} "
                f"(allowed {AGREEMENT_BLEU})")
            if gap > AGREEMENT_BLEU:
                raise SystemExit(f"The conversion is not faithful: BLEU {by_system}.")


def _uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="drive",
                    choices=["drive", "worker", "npz", "ct2-build"], help=argparse.SUPPRESS)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    ap.add_argument("--limit", type=int, help="first N sentences of each set (default: all)")
    ap.add_argument("--modes", nargs="+", default=["single"], choices=MODES,
                    help="how each system uses the cores: single = one call (TF) or one "
                         "batch (CT2) at a time, each spread over the cores' threads; "
                         "concurrent = one call or batch per core at once, one thread each "
                         "(TF Serving's num_batch_threads = cores with intra-op parallelism "
                         "1; CT2's inter_threads = cores, intra_threads 1) (default: single)")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[BATCH], metavar="S",
                    help=f"sentences per batch to sweep, e.g. 16 64 256: the exports' in-graph "
                         f"batch size (the shipped model re-exported with --batch-size S "
                         f"where S differs from its own) and the size of each call in "
                         f"concurrent mode; CT2's batch size (default: {BATCH})")
    ap.add_argument("--model", help="translator SavedModel version dir (default: the highest "
                    "version of saved_models/multi30k_en_de)")
    ap.add_argument("--cpus", help="CPU list every worker is pinned to, e.g. 1 or 0-3 "
                    "(default: all this process may use)")
    ap.add_argument("--threads", type=int,
                    help="CT2 intra_threads (default: the number of --cpus)")
    ap.add_argument("--tf-python", default=sys.executable,
                    help="python with TensorFlow and tfxformer (default: this one)")
    ap.add_argument("--ct2-python", default=os.environ.get("TFXFORMER_CT2_PYTHON"),
                    help="python of the CTranslate2 venv, for the ct2-* systems (default: "
                         "$TFXFORMER_CT2_PYTHON)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed calls per system and set; the median counts (default: 3)")
    ap.add_argument("--best-precision", choices=["fp32", "bf16"], default="fp32",
                    help="--precision of the run-time re-export behind tfxformer-best "
                         "(default: %(default)s)")
    ap.add_argument("--best-shortlist", metavar="K,N",
                    help="--shortlist K,N of the re-export behind tfxformer-best (default: "
                         "none, the full vocabulary)")
    ap.add_argument("--shortlist", metavar="K,N", default=DEFAULT_SHORTLIST,
                    help="--shortlist K,N of the re-export behind tfxformer-shortlist "
                         "(fp32; default: %(default)s)")
    ap.add_argument("--hypotheses-dir", help="keep each system's translations here")
    for hidden in ("--system", "--set", "--hypotheses", "--ct2-dir", "--spm", "--limits",
                   "--npz", "--out"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    wants_ct2 = args.role == "drive" and any(s.startswith("ct2") for s in args.systems)
    if wants_ct2 and not (args.ct2_python and os.access(args.ct2_python, os.X_OK)):
        ap.error(f"the ct2-* systems need the python of a CTranslate2 venv: --ct2-python or "
                 f"TFXFORMER_CT2_PYTHON (got {args.ct2_python!r}; make one with `python3.11 -m "
                 "venv CT2_VENV && CT2_VENV/bin/pip install ctranslate2 sentencepiece numpy "
                 "sacrebleu`), or leave them out with --systems")
    if any(size < 1 for size in args.batch_sizes):
        ap.error(f"--batch-sizes must be >= 1, got {args.batch_sizes}.")
    args.batch_size = args.batch_sizes[0]  # a worker's
    args.mode = args.modes[0]
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}.")
    if args.cpus:
        args.cpu_set = sorted({c for part in args.cpus.split(",") for c in (
            range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))})
    else:
        args.cpu_set = sorted(os.sched_getaffinity(0))
    args.threads = args.threads or len(args.cpu_set)
    args.model = os.path.abspath(args.model) if args.model else latest_version(EXPORT_DIR)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.role == "npz":
        export_npz(args.model, args.out)
    elif args.role == "ct2-build":
        build_ct2(args.npz, args.spm, args.out)
    elif args.role == "worker":
        os.sched_setaffinity(0, args.cpu_set)  # before TF / CT2 size their thread pools
        (ct2_worker if args.system.startswith("ct2") else tf_worker)(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
