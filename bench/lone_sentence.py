#!/usr/bin/env python
"""One sentence at a time: latency of translator exports side by side.

`--what latency` loads every SavedModel of --models here, replays each one's warm-up records
(timed: XLA programs compile there), then sends the first --limit sentences of --text one a
request through `serving_default`, the models alternating sentence by sentence, --repeats
passes: p50 / p95 / mean ms per model, and how many translations equal the first model's.
`--ct2` adds CTranslate2 on the first model's weights in a child process between the passes;
`--cpp` adds each model through TF Serving's C++ loader (tests/cpp/serve_saved_model.cc,
built by bench/serving_memory.py), a child per model and pass timing `Session::Run` alone,
with its peak RSS (an `--xla-max-batch` export runs its compiled search there too).
`--what batch`: the whole text in one request a pass, sentences/s of the median pass.

  PYTHONPATH=$PWD python bench/lone_sentence.py --what latency \\
      --models saved_models/multi30k_en_de NEW_EXPORT --limit 200 --repeats 2 --ct2 float32 --cpp

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


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", choices=["latency", "batch"], default="latency",
                    help="latency: one sentence a request; batch: the whole text in one "
                         "request a pass (default: latency)")
    ap.add_argument("--models", nargs="+", required=True,
                    help="SavedModel version dirs or export dirs (their highest version)")
    ap.add_argument("--labels", nargs="+", help="a name per model (default: its path)")
    ap.add_argument("--text", default=TEXT, help="sources, one a line (default: test_2016)")
    ap.add_argument("--limit", type=int, default=200, help="sentences (default: 200)")
    ap.add_argument("--repeats", type=int, default=2, help="passes over them (default: 2)")
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
            [self.program, *serving_memory.xla_flags(path), self.op_library, path, output,
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


def main(argv=None):
    args = parse_args(argv)
    if args.ct2_child:
        return ct2_child(args)
    if args.labels and len(args.labels) != len(args.models):
        raise SystemExit(f"--labels: {len(args.labels)} names for {len(args.models)} models.")
    return {"latency": latency, "batch": batch}[args.what](args)


if __name__ == "__main__":
    main()
