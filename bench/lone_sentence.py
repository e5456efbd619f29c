#!/usr/bin/env python
"""One sentence at a time: latency of translator exports side by side, and where it goes.

`--what latency` loads every SavedModel of --models in this process, replays each one's
warm-up records (timed: the XLA programs compile there), then translates the first
--limit sentences of --text one request at a time through `serving_default`, the models
alternating sentence by sentence (A/B interleaved: load changes hit all alike), for
--repeats passes; per model p50 / p95 / mean ms a request, and how many translations equal
the first model's. `--ct2 float32 int8` adds CTranslate2 on the first model's weights
(converted by scripts/export.py --format ctranslate2), one sentence a call, in a child
process run between the passes (it loads no TensorFlow). `--cpp` adds each model through
TF Serving's C++ load-and-run path (tests/cpp/serve_saved_model.cc: `LoadSavedModel`, a
`Session::Run` a request, compiled with g++ against the installed wheel by
bench/serving_memory.py): a child process per model and pass replays the export's warm-up
records (else the first 5 sentences), then the same sentences as PredictionLog records, one
text each; its rows ("LABEL (C++ loader)") time `Session::Run` alone and give the child's
peak RSS. An XLA export (`--xla-max-batch`) runs its compiled search there too (a plain
session compiles with XLA:CPU; TF Serving needs --xla_cpu_compilation_enabled=true).

`--what profile` records --limit single-sentence requests of the first model with the
TensorFlow profiler and splits the summed op time: tokenize and detokenize (the
SentencePiece ops and the string ops around them), encoder, the decoder loop (per step:
op runs, by op kind), the loop's frame ops (Enter/Exit/Switch/Merge/NextIteration), an
XLA program (`_XlaRun`, one event for the whole compiled search), the rest of the chunk
and signature graph; "executor gaps" = wall time minus summed op time; "signature call"
= the wall time of a request of zero texts (the fixed cost of calling the signature).

  PYTHONPATH=$PWD python bench/lone_sentence.py --what latency \\
      --models saved_models/multi30k_en_de NEW_EXPORT --limit 200 --repeats 2 --ct2 float32 int8 \\
      --cpp
  PYTHONPATH=$PWD python bench/lone_sentence.py --what profile --models saved_models/multi30k_en_de

Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import benchlib as bl
import serving_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(REPO, "..", "shared", "data", "multi30k", "test_2016_flickr.en")
LOOP_FRAME = {"Enter", "Exit", "Switch", "Merge", "NextIteration", "LoopCond",
              "RefEnter", "RefExit"}
STRING_OPS = ("Sentencepiece", "String", "Unicode", "Substr")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=["latency", "profile", "batch", "split"],
                    default="latency")
    ap.add_argument("--models", nargs="+", required=True,
                    help="SavedModel version dirs or export dirs (their highest version)")
    ap.add_argument("--labels", nargs="+", help="a name per model (default: its path)")
    ap.add_argument("--text", default=TEXT, help="sources, one a line (default: test_2016)")
    ap.add_argument("--limit", type=int, default=200, help="sentences (default: 200)")
    ap.add_argument("--repeats", type=int, default=2, help="passes over them (latency)")
    ap.add_argument("--ct2", nargs="*", default=[], metavar="COMPUTE_TYPE",
                    help="CTranslate2 compute types to time beside (e.g. float32 int8)")
    ap.add_argument("--cpp", action="store_true",
                    help="latency: also time each model through TF Serving's C++ "
                         "load-and-run path (tests/cpp/serve_saved_model.cc, compiled with "
                         "g++ on first use), a child process per model and pass after the "
                         "export's warm-up records (else the first 5 sentences); rows "
                         "'LABEL (C++ loader)' with the child's peak RSS")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="CT2 intra_threads (default: the cores)")
    ap.add_argument("--pause-pids", nargs="*", type=int, default=[], metavar="PID",
                    help="processes (a niced training) stopped (SIGSTOP) for the timed "
                         "passes only and continued (SIGCONT) after them, also on failure")
    ap.add_argument("--ct2-child", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


@contextlib.contextmanager
def paused(pids):
    """Stops `pids` for the block (those still running); always continues them."""
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def read_lines(path, limit):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f][:limit]


def load(path):
    """(serving_default, decoding options, version dir) of a SavedModel."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from tfxformer.serving import resolve_model_dir

    _, path = resolve_model_dir(path)
    with open(os.path.join(path, "assets", "config.json")) as f:
        config = json.load(f)
    return tf.saved_model.load(path).signatures["serving_default"], config, path


def replay_warmup(function, path):
    """Seconds to replay the export's serving_default warm-up records."""
    import tensorflow as tf

    from tfxformer.serving.warmup import read_warmup_records

    start = time.perf_counter()
    for log in read_warmup_records(path):
        request = log.predict_log.request
        if request.model_spec.signature_name not in ("", "serving_default"):
            continue
        function(**{k: tf.make_ndarray(v) for k, v in request.inputs.items()})
    return time.perf_counter() - start


def percentiles(ms):
    ms = sorted(ms)
    return {"p50": round(statistics.median(ms), 2),
            "p95": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 2),
            "mean": round(sum(ms) / len(ms), 2), "n": len(ms)}


def ct2_child(args):
    """One CT2 pass, one sentence a call: prints {"ms": [...], "translations": [...]}."""
    import ctranslate2
    import sentencepiece

    spec = json.loads(args.ct2_child)
    sp = sentencepiece.SentencePieceProcessor(model_file=spec["spm"])
    translator = ctranslate2.Translator(spec["dir"], device="cpu",
                                        compute_type=spec["compute_type"],
                                        inter_threads=1, intra_threads=args.threads)
    d = spec["decoding"]

    def one(line):
        tokens = sp.encode(line, out_type=str)[: d["max_input_tokens"] - 1] + ["</s>"]
        result = translator.translate_batch(
            [tokens], beam_size=d["beam_size"], length_penalty=d["alpha"],
            suppress_sequences=[["<pad>"], ["<s>"]],
            max_decoding_length=min(d["max_output_tokens"], len(tokens) + d["extra_length"]))
        return sp.decode_pieces(result[0].hypotheses[0])

    lines = read_lines(args.text, args.limit)
    for line in lines[:5]:
        one(line)
    ms, out = [], []
    for line in lines:
        start = time.perf_counter()
        out.append(one(line))
        ms.append(1e3 * (time.perf_counter() - start))
    print(json.dumps({"ms": ms, "translations": out, "peak_rss_mib": bl.peak_rss_mib(),
                      "compute_type": translator.compute_type}))


def run_ct2(args, compute_type, ct2_dir, spm, decoding):
    spec = json.dumps({"dir": ct2_dir, "spm": spm, "compute_type": compute_type,
                       "decoding": decoding})
    out = subprocess.run([sys.executable, __file__, "--models", "-", "--text", args.text,
                          "--limit", str(args.limit), "--threads", str(args.threads),
                          "--ct2-child", spec], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


class CppLoader:
    """TF Serving's C++ load-and-run path (serving_memory's build of
    tests/cpp/serve_saved_model.cc) over one model's requests, one sentence each."""

    def __init__(self, folder, lines):
        self.program = serving_memory.build_program(serving_memory.BUILD_DIR)
        self.op_library = serving_memory.op_library()
        self.folder, self.n = folder, len(lines)
        self.requests = os.path.join(folder, "requests.tfrecord")
        serving_memory.write_requests(self.requests, lines, 1)
        self.first5 = os.path.join(folder, "first5.tfrecord")
        serving_memory.write_requests(self.first5, lines[:5], 1)

    def run(self, path):
        """One child on the version dir `path`: {"ms": [...], "translations": [...],
        "peak_rss_mib"} of the requests (the warm-up records before them untimed)."""
        import tensorflow as tf

        warmup = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
        output = os.path.join(self.folder, "out.tfrecord")
        out, _ = serving_memory.run_child(
            [self.program, self.op_library, path, output,
             warmup if os.path.exists(warmup) else self.first5, self.requests],
            dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        lines = [line.split() for line in out.splitlines()]
        ms = [float(f[2]) for f in lines if f[:1] == ["run_ms"]]
        # its own VmHWM: wait4's ru_maxrss counts this process's resident memory at the fork
        peak = round(next(float(f[1]) for f in lines if f[:1] == ["peak_rss_mib"]), 1)
        records = [r.numpy() for r in tf.data.TFRecordDataset(output)]  # name, tensor, ...
        # the requests are the last records, one translation each
        raw = [raw for name, raw in zip(records[::2], records[1::2], strict=True)
               if name == b"serving_default/translation"][-self.n:]
        translations = []
        for serialized in raw:
            proto = tf.make_tensor_proto(0)
            proto.ParseFromString(serialized)
            translations.append(tf.make_ndarray(proto)[0].decode())
        return {"ms": ms[-self.n:], "translations": translations, "peak_rss_mib": peak}


def latency(args):
    import tensorflow as tf

    labels = args.labels or args.models
    models = [load(path) for path in args.models]
    warm = [round(replay_warmup(fn, path), 1) for fn, _, path in models]
    lines = read_lines(args.text, args.limit)
    for fn, _, _ in models:  # untimed, after the warm-up records
        for line in lines[:20]:
            fn(text=tf.constant([line]))
    ct2_dir = None
    if args.ct2:
        ct2_dir = tempfile.mkdtemp(prefix="tfx_lone_ct2_")
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "export.py"), "--format",
                        "ctranslate2", "--model", models[0][2], "--export-dir", ct2_dir],
                       check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=REPO))
        decoding = models[0][1]["decoding"]
        spm = os.path.join(models[0][2], "assets", "spm.model")
    cpp = CppLoader(tempfile.mkdtemp(prefix="tfx_lone_cpp_"), lines) if args.cpp else None
    ms = collections.defaultdict(list)
    first, same, peaks = {}, collections.Counter(), {}
    load_before = os.getloadavg()[0]
    with paused(args.pause_pids):
        passes(args, labels, models, lines, ms, first, same, ct2_dir, spm if args.ct2 else None,
               decoding if args.ct2 else None, cpp, peaks)
    if cpp:
        shutil.rmtree(cpp.folder, ignore_errors=True)
    rows = {label: {**percentiles(values), "same_as_first": f"{same[label]}/{len(values)}",
                    **({"peak_rss_mib": peaks[label]} if label in peaks else {})}
            for label, values in ms.items()}
    for label, row in rows.items():
        bl.log(f"{label}: {row}")
    base = rows[labels[0]]["p50"]
    ratios = {label: round(base / row["p50"], 2) for label, row in rows.items()}
    bl.log(f"p50 speed against {labels[0]}: {ratios}; warm-up replay s: "
           f"{dict(zip(labels, warm, strict=True))}")
    bl.emit({"bench": "lone_sentence", "rows": rows, "speed_vs_first": ratios,
             "warmup_s": dict(zip(labels, warm, strict=True)), "limit": args.limit,
             "repeats": args.repeats, "paused": args.pause_pids,
             "loadavg_1min_before": round(load_before, 2), "peak_rss_mib": bl.peak_rss_mib(),
             **bl.machine()})


def passes(args, labels, models, lines, ms, first, same, ct2_dir, spm, decoding, cpp, peaks):
    """The timed passes: TF models alternating sentence by sentence, then CT2 (each type in
    a child process), then the C++ loader (a child process per model), --repeats times."""
    import tensorflow as tf

    for _ in range(args.repeats):
        for i, line in enumerate(lines):
            for label, (fn, _, _) in zip(labels, models, strict=True):
                start = time.perf_counter()
                out = fn(text=tf.constant([line]))["translation"].numpy()[0].decode()
                ms[label].append(1e3 * (time.perf_counter() - start))
                if label == labels[0]:
                    first[i] = out
                same[label] += out == first[i]
        for compute_type in args.ct2:
            result = run_ct2(args, compute_type, ct2_dir, spm, decoding)
            label = f"ct2-{compute_type}"
            ms[label] += result["ms"]
            same[label] += sum(a == first[i] for i, a in enumerate(result["translations"]))
        if cpp is not None:
            for label, (_, _, path) in zip(labels, models, strict=True):
                result = cpp.run(path)
                label = f"{label} (C++ loader)"
                ms[label] += result["ms"]
                same[label] += sum(a == first[i] for i, a in enumerate(result["translations"]))
                peaks[label] = max(peaks.get(label, 0), result["peak_rss_mib"])


def batch(args):
    """The whole text in one request a pass (the translator's chunks of its batch size),
    the models alternating pass by pass; sentences/s of the median pass."""
    import tensorflow as tf

    labels = args.labels or args.models
    models = [load(path) for path in args.models]
    text = tf.constant(read_lines(args.text, args.limit))
    outputs = {label: fn(text=text)["translation"].numpy().tolist()
               for label, (fn, _, _) in zip(labels, models, strict=True)}
    seconds = collections.defaultdict(list)
    load_before = os.getloadavg()[0]
    with paused(args.pause_pids):
        for _ in range(args.repeats):
            for label, (fn, _, _) in zip(labels, models, strict=True):
                start = time.perf_counter()
                fn(text=text)
                seconds[label].append(time.perf_counter() - start)
    n = int(text.shape[0])
    same = {label: sum(a == b for a, b in zip(out, outputs[labels[0]], strict=True))
            for label, out in outputs.items()}
    rows = {label: {"sentences_per_s": round(n / statistics.median(values), 1),
                    "seconds": [round(v, 2) for v in values],
                    "same_as_first": f"{same[label]}/{n}"}
            for label, values in seconds.items()}
    for label, row in rows.items():
        bl.log(f"{label}: {row}")
    bl.emit({"bench": "lone_sentence_batch", "rows": rows, "sentences": n,
             "repeats": args.repeats, "paused": args.pause_pids,
             "loadavg_1min_before": round(load_before, 2), **bl.machine()})


def classify(name, op_type):
    """The part of a request an op event belongs to."""
    if op_type == "_XlaRun" or "XlaLaunch" in op_type:
        return "XLA program (whole search)"
    if op_type.startswith(STRING_OPS) or "Detokenize" in op_type:
        return "tokenize / detokenize (string ops)"
    if op_type in LOOP_FRAME:
        return "loop frame ops"
    if "/while/while/body/" in name or "/while/while/cond/" in name:
        return "decoder loop"
    if "encoder" in name or "positional_encoding" in name or "embedding" in name:
        return "encoder"
    return "chunk and signature graph (ragged, sort, pad, gather, cond)"


def profile(args):
    import tensorflow as tf
    from profile_ops import op_events

    tf.config.threading.set_inter_op_parallelism_threads(1)  # op times do not overlap
    fn, _, path = load(args.models[0])
    replay_warmup(fn, path)
    lines = read_lines(args.text, args.limit)
    for line in lines:
        fn(text=tf.constant([line]))
    empty = tf.constant([], tf.string)
    calls = []
    for _ in range(20):
        start = time.perf_counter()
        fn(text=empty)
        calls.append(1e3 * (time.perf_counter() - start))
    logdir = tempfile.mkdtemp(prefix="tfx_lone_profile_")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    for line in lines:
        fn(text=tf.constant([line]))
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    events = op_events(logdir)
    n = len(lines)
    parts, kinds, names = collections.Counter(), collections.Counter(), collections.Counter()
    runs = collections.Counter()
    for name, op_type, seconds in events:
        part = classify(name, op_type)
        parts[part] += seconds
        runs[part] += 1
        if part == "decoder loop":
            kinds[op_type.lstrip("_").replace("Mkl", "").replace("Native", "")] += seconds
            names[name] += 1
    # Each op of the loop body runs once a step (ops in a tf.cond less): the most common
    # run count of the body's op names is the number of steps.
    steps = collections.Counter(names.values()).most_common(1)[0][0] if names else 0
    total = sum(parts.values())
    bl.log(f"{path}, {n} single-sentence requests: wall {1e3 * wall / n:.2f} ms a request, "
           f"summed op time {1e3 * total / n:.2f} ms, executor gaps "
           f"{1e3 * (wall - total) / n:.2f} ms; signature call of 0 texts "
           f"{statistics.median(calls):.2f} ms; decoder steps {steps / n:.1f} a sentence")
    table = {}
    for part, seconds in parts.most_common():
        table[part] = {"ms_per_request": round(1e3 * seconds / n, 3),
                       "op_runs_per_request": round(runs[part] / n, 1)}
        bl.log(f"| {part} | {table[part]['ms_per_request']} | "
               f"{table[part]['op_runs_per_request']} |")
    per_step = {}
    if steps:
        bl.log(f"decoder loop: {runs['decoder loop'] / steps:.0f} op runs a step, "
               f"{1e6 * parts['decoder loop'] / steps:.0f} us a step; by kind (us a step):")
        for kind, seconds in kinds.most_common(15):
            per_step[kind] = round(1e6 * seconds / steps, 1)
            bl.log(f"| {kind} | {per_step[kind]} |")
    durations = sorted(seconds for _, _, seconds in events)
    bl.emit({"bench": "lone_sentence_profile", "model": path, "requests": n,
             "wall_ms_per_request": round(1e3 * wall / n, 2),
             "op_ms_per_request": round(1e3 * total / n, 2),
             "empty_call_ms": round(statistics.median(calls), 2),
             "steps_per_sentence": round(steps / n, 2),
             "loop_op_runs_per_step": round(runs["decoder loop"] / steps, 1) if steps else None,
             "median_op_us": round(1e6 * durations[len(durations) // 2], 2) if events else None,
             "parts": table, "loop_us_per_step_by_kind": per_step, "logdir": logdir,
             **bl.machine()})


def split(args):
    """The compiled path's request, split: the export's weights in an in-process Translator
    (`xla_max_batch` 1, the export's options and precision); per sentence the whole call,
    the compiled search alone on its tokenized source, and a call of zero texts; the
    decoder steps from the graph path's search (`steps`)."""
    import tensorflow as tf

    from tfxformer import pretrained
    from tfxformer.decoding import beam_search
    from tfxformer.models.transformer import Transformer
    from tfxformer.serving.multilingual_translator import make_translator

    _, config, path = load(args.models[0])
    model, record, spm = pretrained.load_saved_model_weights(
        Transformer, path, precision=config.get("precision", "fp32"))
    d = record.decoding
    translator = make_translator(
        model, spm, record.target_languages, beam_size=d.beam_size, alpha=d.alpha,
        extra_length=d.extra_length, max_input_tokens=d.max_input_tokens,
        max_output_tokens=d.max_output_tokens, stopping=d.stopping,
        length_normalization=d.length_normalization, xla_max_batch=1)
    search = translator.compiled_search
    steps_of = tf.function(lambda source: beam_search(
        model, source, d.beam_size, d.alpha, d.extra_length, d.max_output_tokens,
        stopping=d.stopping, length_normalization=d.length_normalization).steps,
        input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)
    lines = read_lines(args.text, args.limit)
    sources = [translator.tokenize(tf.constant([line])).to_tensor() for line in lines]
    for bucket in search.length_buckets:  # compile every program first
        translator(tf.constant([" ".join(["dog"] * (bucket - 1))]))
    empty = tf.constant([], tf.string)
    times = collections.defaultdict(list)
    steps = [int(steps_of(source)[0]) for source in sources]
    with paused(args.pause_pids):
        for _ in range(args.repeats):
            for line, source in zip(lines, sources, strict=True):
                for name, call, given in (("request", translator, tf.constant([line])),
                                          ("search", search.search, source),
                                          ("empty", translator, empty)):
                    extra = (d.alpha,) if name == "search" else ()
                    start = time.perf_counter()
                    tf.nest.map_structure(lambda t: t.numpy(), call(given, *extra))
                    times[name].append(1e3 * (time.perf_counter() - start))
    p50 = {name: round(statistics.median(values), 3) for name, values in times.items()}
    per_step = statistics.median(t / s for t, s in zip(
        times["search"], steps * args.repeats, strict=True))
    bl.log(f"{path} ({config.get('precision')}), {len(lines)} sentences: p50 ms {p50}; "
           f"decoder steps {statistics.mean(steps):.1f} a sentence; compiled search "
           f"{1e3 * per_step:.0f} us a step (encoder included)")
    bl.emit({"bench": "lone_sentence_split", "model": path, "p50_ms": p50,
             "steps_mean": round(statistics.mean(steps), 2),
             "search_us_per_step": round(1e3 * per_step, 1), "paused": args.pause_pids,
             **bl.machine()})


def main(argv=None):
    args = parse_args(argv)
    if args.ct2_child:
        return ct2_child(args)
    if args.labels and len(args.labels) != len(args.models):
        raise SystemExit(f"--labels: {len(args.labels)} names for {len(args.models)} models.")
    return {"latency": latency, "profile": profile, "batch": batch,
            "split": split}[args.what](args)


if __name__ == "__main__":
    main()
