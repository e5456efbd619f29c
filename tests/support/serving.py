"""What the serving tests share: hostile inputs, the tiny SentencePiece model, the script
that loads an export in a fresh process, and scripts/*.py run in this process."""

import contextlib
import importlib.util
import io
import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import sentencepiece as spm
import tensorflow as tf

from support.environment import SHARED_DATA, user_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROBUST_INPUTS = [
    b"A dog runs in the park.", b"", b" ", b"\t  \t", b"\xff\xfe\xfd", b"abc \xc3 def \xe2\x82",
    b"\xed\xa0\x80 lone surrogate", b"\xf4\x90\x80\x80 beyond U+10FFFF", b"\xc0\xaf overlong",
    "😀🎉 👩‍👩‍👧 🏳️‍🌈".encode(), "Ünïcödé ß ẞ Œ".encode(), "日本語 中文 한국어".encode(),
    "العربية עברית".encode(), "हिन्दी தமிழ் ไทย ქართული".encode(), "Ελληνικά Кириллица".encode(),
    b"\x00\x01\x07\x1b[31m\x7f", "\u200b\u200d\ufeff\u202e override".encode(),
    "e\u0301\u0301\u0301 Z\u0351\u0352".encode(), "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ".encode() * 3000, b"word " * 20000,
]


DATA = SHARED_DATA


@contextlib.contextmanager
def saved_models_loaded_once():
    """`tf.saved_model.load` remembered by path inside the block (a tiny full export takes
    seconds of CPU to load, and the first call of each of its signatures as many again):
    for tests whose subject is what the loaders and scripts do with a loaded export, not
    the loading itself (tested here). Yields {realpath: loaded object}."""
    loaded, load = {}, tf.saved_model.load

    def load_once(path, *args, **kwargs):
        key = os.path.realpath(os.fspath(path))
        if key not in loaded:
            loaded[key] = load(path, *args, **kwargs)
        return loaded[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf.saved_model, "load", load_once)
        yield loaded


def train_sentencepiece(lines=2000):
    """A tiny BPE model on Multi30k EN + DE with the fixed ids (pad 0, unk 1, bos 2, eos 3)."""
    text = []
    for lang in ("en", "de"):
        with open(os.path.join(DATA, "multi30k", f"train.{lang}"), encoding="utf-8") as f:
            text += list(itertools.islice(f, lines))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=320, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        minloglevel=2)
    return model.getvalue()


FRESH_PROCESS = textwrap.dedent("""
    import base64, contextlib, io, json, os, sys
    sys.modules["tfxformer"] = None  # importing tfxformer here must fail
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry

    # argv: the version dir, then the checks ("signatures": every signature, the default;
    # "translation": serving_default alone; "session": serving_default through the session
    # alone, without tf.saved_model.load; "replay": the warm-up records through the
    # session; "cli": saved_model_cli show and run), comma-separated
    path, inputs = sys.argv[1], [base64.b64decode(t) for t in json.load(sys.stdin)]
    checks = set((sys.argv[2] if len(sys.argv) > 2 else "signatures").split(","))
    proto = saved_model_pb2.SavedModel()
    with open(path + "/saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    functions = {f.signature.name for f in graph.library.function}
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    ops -= functions
    core = {op for op in ops if op_def_registry.get(op) is not None}
    import tensorflow_text  # noqa: registers its ops
    text = {op for op in ops - core if op_def_registry.get(op) is not None}

    result = {"core": sorted(core), "text": sorted(text), "unknown": sorted(ops - core - text)}
    if checks != {"session"}:
        model = tf.saved_model.load(path)
        out = model.signatures["serving_default"](text=tf.constant(inputs))
        result.update(translation=[t.decode("utf-8") for t in out["translation"].numpy()],
                      score=out["score"].numpy().tolist(),
                      truncated=out["truncated"].numpy().tolist())
    if "signatures" in checks:
        options = model.signatures["translate_with_options"](
            text=tf.constant(inputs), beam_size=tf.constant(1), alpha=tf.constant(0.0),
            extra_length=tf.constant(2))
        alternate = lambda a, b: tf.constant([(a, b)[i % 2] for i in range(len(inputs))])
        per_example = model.signatures["translate_per_example"](  # greedy, the defaults, ...
            text=tf.constant(inputs), beam_size=alternate(1, 3), alpha=alternate(0.0, 0.6),
            extra_length=alternate(2, 4), max_input_tokens=alternate(1000, 1000))
        scored = model.signatures["score"](text=tf.constant(inputs),
                                           target=tf.constant(inputs[::-1]))
        sampled = model.signatures["translate_sampled"](
            text=tf.constant(inputs), sampling_topk=tf.constant(5),
            sampling_temperature=tf.constant(1.0), sampling_topp=tf.constant(0.9),
            extra_length=tf.constant(4), seed=tf.constant(3, tf.int64))
        result.update(
            options=[t.decode("utf-8") for t in options["translation"].numpy()],
            per_example=[t.decode("utf-8") for t in per_example["translation"].numpy()],
            scored=scored["log_prob"].numpy().tolist(),
            sampled=[t.decode("utf-8") for t in sampled["translation"].numpy()])
    # The session loader, as TF Serving loads: the graph Grappler optimizes, as this process
    # runs it (a user's: run_checked starts it with user_env()).
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        fetched, scores = session.run([signature.outputs["translation"].name,
                                       signature.outputs["score"].name],
                                      {signature.inputs["text"].name: inputs})
        result["session"] = [t.decode("utf-8") for t in fetched]
        result["session_score"] = scores.tolist()
        if "signatures" in checks:
            signature = meta.signature_def["score"]
            result["session_scored"] = session.run(signature.outputs["log_prob"].name, {
                signature.inputs["text"].name: inputs,
                signature.inputs["target"].name: inputs[::-1]}).tolist()
        if "replay" in checks:  # TF Serving replays the warm-up records on load
            from tensorflow_serving.apis import prediction_log_pb2

            result["replay"] = []
            warmup = path + "/assets.extra/tf_serving_warmup_requests"
            for raw in tf.compat.v1.io.tf_record_iterator(warmup):
                log = prediction_log_pb2.PredictionLog()
                log.ParseFromString(raw)
                request = log.predict_log.request
                signature = meta.signature_def[request.model_spec.signature_name or
                                               "serving_default"]
                feeds = {signature.inputs[k].name: tf.make_ndarray(v)
                         for k, v in request.inputs.items()}
                keys = sorted(signature.outputs)
                values = session.run([signature.outputs[k].name for k in keys], feeds)
                replied = dict(zip(keys, values))
                result["replay"].append({
                    "kind": log.WhichOneof("log_type"),
                    "signature": request.model_spec.signature_name,
                    "inputs": {k: [int(d.size) for d in v.tensor_shape.dim]
                               for k, v in request.inputs.items()},
                    "text": sorted({t.decode()
                                    for t in tf.make_ndarray(request.inputs["text"])}),
                    "outputs": {k: list(v.shape) for k, v in replied.items()},
                    "translation": [t.decode("utf-8")
                                    for t in replied.get("translation", [])],
                    "length": [int(x) for x in replied.get("length", [])]})
    if "cli" in checks:  # the `saved_model_cli` console script's main, as the docs use it
        from tensorflow.python.tools.saved_model_cli import main as cli_main

        for command in (["show", "--dir", path, "--all"],
                        ["run", "--dir", path, "--tag_set", "serve", "--signature_def",
                         "serving_default", "--input_exprs", 'text=["A dog.", ""]']):
            sys.argv, shown = ["saved_model_cli", *command], io.StringIO()
            with contextlib.redirect_stdout(shown):
                try:
                    cli_main()
                except SystemExit as exit_:
                    assert not exit_.code, (command, exit_.code)
            result["cli_" + command[0]] = shown.getvalue()
    # what the process ran with: TF_* as its caller set them, Grappler as configured
    result["environment"] = {"TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS")}
    result["grappler_off"] = tf.config.optimizer.get_experimental_options().get(
        "disable_meta_optimizer", False)
    result["tfxformer_loaded"] = any(m.startswith("tfxformer") for m in sys.modules
                                     if sys.modules[m] is not None)
    print(json.dumps(result))
""")


def run_checked(args, **kwargs):
    """Runs `args` as a user's process (user_env: none of the test processes' switches); it
    must exit with 0; its standard output, decoded."""
    env = user_env(TF_CPP_MIN_LOG_LEVEL="3")
    # against hangs only: on a loaded machine a process of 15 s of CPU took 4 minutes
    result = subprocess.run(args, capture_output=True, env=env, timeout=900, **kwargs)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result.stdout.decode("utf-8")




def load_script(name):
    """scripts/<name>.py as a module (its functions, without running main)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name, argv, stdin=b""):
    """scripts/<name>.py's main(argv) in this process, `stdin` its standard input: its exit
    code must be 0; its standard output, decoded as strict UTF-8."""
    stdout, saved = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), (sys.stdin, sys.stdout)
    sys.stdin, sys.stdout = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"), stdout
    try:
        code = load_script(name).main(argv)
        stdout.flush()
    finally:
        sys.stdin, sys.stdout = saved
    assert code == 0
    return stdout.buffer.getvalue().decode("utf-8")
