#!/usr/bin/env python
"""Peak memory of a process serving a translator SavedModel, in both loaders.

  python  `tf.saved_model.load` and `serving_default` (as scripts/translate.py), resident
          MiB after each stage (`import tensorflow` and the SentencePiece ops, the model
          loaded, its warm-up records replayed, the set translated) and the file-backed part.
  cpp     tests/cpp/serve_saved_model.cc, TF Serving's session-based C++ loader
          (`LoadSavedModel`, `Session::Run` a request), compiled here with g++ against the
          installed wheel; the same warm-up records and requests.

Each translates --set in requests of --batch-size through `serving_default` in its own
child process; the figure is the child's peak RSS (`wait4` ru_maxrss). --env runs every
loader once more per variant with those environment variables.

    PYTHONPATH=$PWD python bench/serving_memory.py --model saved_models/multi30k_en_de \
        --data ../shared/data/multi30k [--env TF_ENABLE_ONEDNN_OPTS=0]

One JSON line per loader and variant.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "tests", "cpp", "serve_saved_model.cc")
BUILD_DIR = os.path.join(tempfile.gettempdir(), "tfxformer_cpp")  # the compiled loader's


def _rss_mib(field: str = "VmRSS") -> float:
    """Resident MiB of this process: all of it (VmRSS) or its file-backed part (RssFile:
    pages of the shared libraries and files it mapped)."""
    with open("/proc/self/status") as f:
        kib = next(line for line in f if line.startswith(field + ":")).split()[1]
    return round(int(kib) / 1024, 1)


def python_worker(model: str, warmup: str, requests: str) -> None:
    """The `python` loader (run as a child): prints its stages as one JSON line."""
    stages, files = {}, {}
    import tensorflow as tf

    from tfxformer.serving import load_sentencepiece_ops
    from tfxformer.serving.warmup import read_warmup_records

    load_sentencepiece_ops()  # the SavedModel's SentencePiece ops, as load_translate_fn
    stages["import"], files["import"] = _rss_mib(), _rss_mib("RssFile")
    loaded = tf.saved_model.load(model)
    stages["loaded"], files["loaded"] = _rss_mib(), _rss_mib("RssFile")
    for path, stage in ((warmup, "warm_up"), (requests, "set_translated")):
        for log in read_warmup_records(path):
            request = log.predict_log.request
            loaded.signatures[request.model_spec.signature_name](
                **{k: tf.make_ndarray(v) for k, v in request.inputs.items()})
        stages[stage], files[stage] = _rss_mib(), _rss_mib("RssFile")
    print(json.dumps({"stages": stages, "file_backed": files}))


def write_requests(path: str, texts: list[str], batch_size: int) -> int:
    """PredictionLog records of `serving_default` requests, `batch_size` texts each."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    with tf.io.TFRecordWriter(path) as writer:
        for start in range(0, len(texts), batch_size):
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = "serving_default"
            request.inputs["text"].CopyFrom(
                tf.make_tensor_proto(texts[start: start + batch_size], dtype=tf.string))
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())
    return -(-len(texts) // batch_size)


def xla_flags(version_dir: str) -> list[str]:
    """The C++ loader's flag an export of the compiled search needs (it runs XLA:CPU only
    with it, as tensorflow_model_server), else none."""
    with open(os.path.join(version_dir, "assets", "config.json"), encoding="utf-8") as f:
        compiled = json.load(f).get("xla_max_batch", 0) > 0
    return ["--xla_cpu_compilation_enabled=true"] if compiled else []


def build_program(build_dir: str) -> str:
    """Compiles tests/cpp/serve_saved_model.cc once per source and TensorFlow; its path."""
    import tensorflow as tf

    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise SystemExit("the cpp loader needs a C++ compiler (g++ or c++) on PATH")
    tf_dir = os.path.dirname(tf.__file__)
    flags = [*tf.sysconfig.get_compile_flags(), "-O1", "-w"]
    links = [*tf.sysconfig.get_link_flags(), "-l:libtensorflow_cc.so.2", f"-Wl,-rpath,{tf_dir}"]
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + repr((flags, links, tf.__version__)).encode())
    binary = os.path.join(build_dir, f"serve_saved_model-{key.hexdigest()[:16]}")
    if not os.path.exists(binary):
        os.makedirs(build_dir, exist_ok=True)
        print(f"compiling {os.path.relpath(SOURCE, REPO)} (a few minutes)", file=sys.stderr)
        subprocess.run([compiler, *flags, SOURCE, "-o", binary + ".tmp", *links], check=True)
        os.replace(binary + ".tmp", binary)
    return binary


# tensorflow-text's op libraries an export's graph uses (TF Serving links them all in).
OP_LIBRARIES = ("_sentencepiece_tokenizer.so", "_regex_split_ops.so")


def op_library() -> str:
    """tensorflow-text's op libraries an export uses, ':'-separated: the C++ loader's
    first argument."""
    import tensorflow_text

    folder = os.path.join(os.path.dirname(tensorflow_text.__file__), "python", "ops")
    return ":".join(os.path.join(folder, name) for name in OP_LIBRARIES)


def run_child(cmd: list[str], env: dict) -> tuple[str, float]:
    """(stdout, peak RSS MiB) of `cmd` run to its end."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if process.returncode:
        raise RuntimeError(f"{cmd[:3]} failed ({process.returncode}): {text[-1000:]}"
                           f"{errors[-2000:]}")
    return text, round(usage.ru_maxrss / 1024, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="translator SavedModel version dir")
    parser.add_argument("--data", required=True,
                        help="folder with <set>.<src> files, e.g. ../shared/data/multi30k")
    parser.add_argument("--set", default="test_2016_flickr",
                        help="file stem of the sources (default: %(default)s)")
    parser.add_argument("--src", default="en", help="source language suffix (default: en)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="texts per request (default: %(default)s)")
    parser.add_argument("--loaders", nargs="+", choices=["python", "cpp"],
                        default=["python", "cpp"], help="loaders to measure (default: both)")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="one variant more per entry: environment settings, several "
                             "joined by commas, e.g. TF_ENABLE_ONEDNN_OPTS=0")
    parser.add_argument("--build-dir", default=BUILD_DIR,
                        help="where the compiled C++ loader is kept (default: %(default)s)")
    parser.add_argument("--role", default="drive", choices=["drive", "python"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--requests", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warmup = os.path.join(args.model, "assets.extra", "tf_serving_warmup_requests")
    if args.role == "python":
        python_worker(args.model, warmup, args.requests)
        return 0
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    bad = [item for entry in args.env for item in entry.split(",") if "=" not in item]
    if bad:
        parser.error(f"--env takes NAME=VALUE settings (several joined by commas), got {bad}")
    variants = [{}] + [dict(item.split("=", 1) for item in entry.split(",")) for entry in args.env]
    with open(os.path.join(args.data, f"{args.set}.{args.src}"), encoding="utf-8") as f:
        texts = [line.rstrip("\n") for line in f]
    with tempfile.TemporaryDirectory() as tmp:
        requests = os.path.join(tmp, "requests.tfrecord")
        count = write_requests(requests, texts, args.batch_size)
        commands = {"python": [sys.executable, __file__, "--role", "python", "--model",
                               args.model, "--data", args.data, "--requests", requests]}
        if "cpp" in args.loaders:
            commands["cpp"] = [build_program(args.build_dir), *xla_flags(args.model),
                               op_library(), args.model,
                               os.path.join(tmp, "out.tfrecord"), warmup, requests]
        for variant in variants:
            for loader in args.loaders:
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO, **variant)
                out, peak = run_child(commands[loader], env)
                files = None
                if loader == "python":
                    report = json.loads(out.strip().splitlines()[-1])
                    stages, files = report["stages"], report["file_backed"]
                else:  # "rss_mib STAGE MiB" lines: after_1 = warm-up, after_2 = the set
                    names = {"after_1": "warm_up", "after_2": "set_translated"}
                    stages = {names.get(f[1], f[1]): round(float(f[2]), 1)
                              for f in (line.split() for line in out.splitlines())
                              if f[:1] == ["rss_mib"]}
                print(json.dumps({"loader": loader, "env": variant, "model": args.model,
                                  "set": args.set, "requests": count,
                                  "batch_size": args.batch_size, "peak_rss_mib": peak,
                                  "stages_mib": stages,
                                  **({"file_backed_mib": files} if files else {})}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
