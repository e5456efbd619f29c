#!/usr/bin/env python
"""Real-text translation benchmark: the shipped EN→DE model against CTranslate2 on its weights.

Systems, each in its own process (so `ru_maxrss` is its own peak RSS):
  tfxformer-fp32       the shipped SavedModel (highest version), strings in and out through
                       `serving_default`.
  tfxformer-best       its variables re-exported at run time (`scripts/export.py --precision
                       --best-precision`, and `--shortlist --best-shortlist` from multi30k).
  tfxformer-ct2search  re-exported at fp32 with CTranslate2's search (`--stopping finished
                       --length-normalization length`: K hypotheses finished, log P / |Y|^α,
                       |Y| without the EOS), so it differs from ct2-float32 only by
                       arithmetic and CT2's per-batch length limit; the log counts equal
                       translations. The shipped export stops at "bound" and scores "gnmt".
  ct2-float32, -int8   the weights converted by `scripts/export.py --format ctranslate2` (in
                       the project venv: keep CTranslate2 on the same version in both venvs).

CT2 gets SentencePiece pieces cut to max_input_tokens - 1 plus "</s>", the SavedModel's own
beam size and α (its assets/config.json `decoding`) as `beam_size` and `length_penalty`,
<pad> and <s> suppressed, batches sorted by length with `max_decoding_length` = min(
max_output_tokens, longest source + extra_length).

Timing: per system, set, mode and batch size, one untimed call on the first 64 sentences,
then --repeats passes; sentences/s and target tokens/s (output pieces, EOS not counted) of
the median pass; cased sacreBLEU. --modes: see --help. Pin to free cores with --cpus: CT2
with more threads than free cores stalls.

The CT2 part runs in its own venv (--ct2-python or TFXFORMER_CT2_PYTHON):
  python3.11 -m venv CT2_VENV && CT2_VENV/bin/pip install ctranslate2 sentencepiece numpy sacrebleu
Prints one JSON line per system, set, mode and batch size; details go to stderr.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "..", "shared", "data")
EXPORT_DIR = os.path.join(REPO, "saved_models", "multi30k_en_de")
SYSTEMS = ("tfxformer-fp32", "tfxformer-best", "tfxformer-ct2search", "ct2-float32",
           "ct2-int8")
# CTranslate2's beam search as export flags: stop at K finished, log P / |Y|^α without EOS.
CT2_SEARCH = ("--stopping", "finished", "--length-normalization", "length")
MODES = ("single", "concurrent")
SETS = {"test_2016_flickr": ("multi30k", "test_2016_flickr"),
        "newstest2014": ("wmt14", "newstest2014")}
BEAM, ALPHA, BATCH = 4, 0.6, 64
WARMUP = 64
AGREEMENT_BLEU = 0.3


def latest_version(export_dir: str) -> str:
    versions = [int(v) for v in os.listdir(export_dir) if v.isdigit()]
    if not versions:
        raise FileNotFoundError(f"No numbered SavedModel version in {export_dir!r}.")
    return os.path.join(export_dir, str(max(versions)))


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
        _run([args.tf_python, os.path.join(REPO, "scripts", "export.py"), "--format",
              "ctranslate2", "--model", args.model, "--export-dir", paths["ct2"]], env)
    exports = {"tfxformer-fp32": ("fp32", "fp32", None, ()),
               "tfxformer-best": ("best", args.best_precision, args.best_shortlist, ()),
               "tfxformer-ct2search": ("ct2search", "fp32", None, CT2_SEARCH)}
    for system, (name, precision, shortlist, search) in exports.items():
        if system not in args.systems:
            continue
        for size in args.batch_sizes:
            if name == "fp32" and size == decoding.get("batch_size", BATCH):
                paths[name, size] = args.model  # the shipped export as it is
                continue
            paths[name, size] = _export(args, env, os.path.join(tmp, f"{name}_{size}"),
                                        precision, shortlist, size, limits, search)
    log(f"limits {limits}")
    return paths, env


def _export(args, env, export_dir, precision, shortlist, batch_size, limits, search=()):
    """The model's variables re-exported with these options (`search`: more export flags);
    -> the version dir."""
    flags = ["--shortlist", shortlist, "--shortlist-data",
             os.path.join(DATA, "multi30k")] if shortlist else []
    out = _run([args.tf_python, os.path.join(REPO, "scripts", "export.py"), "--model",
                args.model, "--export-dir", export_dir, "--precision", precision,
                "--batch-size", str(batch_size),
                "--max-input-tokens", str(limits["max_input_tokens"]),
                "--max-output-tokens", str(limits["max_output_tokens"]),
                "--extra-length", str(limits["extra_length"]), *flags, *search], env)
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
        log_identical(args, args.hypotheses_dir or tmp)
    log(f"uptime after: {_uptime()}")
    check_agreement(rows)


def log_identical(args, folder, peer="ct2-float32"):
    """Logs how many translations each tfxformer system shares with `peer`, per set, mode
    and batch size (the same search gives the same strings up to arithmetic)."""
    for name, mode, size in ((n, m, s) for n in args.sets for m in args.modes
                             for s in args.batch_sizes):
        texts = {}
        for system in args.systems:
            path = os.path.join(folder, f"{system}.{mode}.{size}.{name}.txt")
            if os.path.isfile(path):
                with open(path, encoding="utf-8", newline="") as f:
                    texts[system] = f.read().split("\n")[:-1]
        for system in (s for s in texts if s.startswith("tfxformer") and peer in texts):
            same = sum(a == b for a, b in zip(texts[system], texts[peer], strict=True))
            log(f"identical to {peer}, {name} {mode} S={size}: {system} {same} of "
                f"{len(texts[peer])}")


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
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="drive",
                    choices=["drive", "worker"], help=argparse.SUPPRESS)
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
    ap.add_argument("--best-precision", choices=["fp32", "bf16", "auto"], default="auto",
                    help="--precision of the run-time re-export behind tfxformer-best; auto: "
                         "bf16 where this CPU has AVX512_BF16 or AMX, else fp32 (default: "
                         "%(default)s)")
    ap.add_argument("--best-shortlist", metavar="K,N",
                    help="--shortlist K,N of the re-export behind tfxformer-best (default: "
                         "none, the full vocabulary)")
    ap.add_argument("--hypotheses-dir", help="keep each system's translations here")
    for hidden in ("--system", "--set", "--hypotheses", "--ct2-dir", "--spm", "--limits"):
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
    if args.role == "worker":
        os.sched_setaffinity(0, args.cpu_set)  # before TF / CT2 size their thread pools
        (ct2_worker if args.system.startswith("ct2") else tf_worker)(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
