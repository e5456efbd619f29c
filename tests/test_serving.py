"""tfxformer.serving: in-graph translation, SavedModel export, and what serves it."""

import base64
import importlib.util
import io
import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import SHARED_DATA

from tfxformer import Transformer
from tfxformer.decoding import EOS_ID, beam_search, greedy_decode
from tfxformer.serving import Translator, export_translator, next_version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LENGTH = 48
ROBUST_INPUTS = [
    b"A dog runs in the park.", b"", b" ", b"\t  \t", b"\xff\xfe\xfd", b"abc \xc3 def \xe2\x82",
    b"\xed\xa0\x80 lone surrogate", b"\xf4\x90\x80\x80 beyond U+10FFFF", b"\xc0\xaf overlong",
    "😀🎉 👩‍👩‍👧 🏳️‍🌈".encode(), "Ünïcödé ß ẞ Œ".encode(), "日本語 中文 한국어".encode(),
    "العربية עברית".encode(), "हिन्दी தமிழ் ไทย ქართული".encode(), "Ελληνικά Кириллица".encode(),
    b"\x00\x01\x07\x1b[31m\x7f", "\u200b\u200d\ufeff\u202e override".encode(),
    "e\u0301\u0301\u0301 Z\u0351\u0352".encode(), "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ".encode() * 3000, b"word " * 20000,
]


def train_sentencepiece(lines=2000):
    """A tiny BPE model on Multi30k EN + DE with the fixed ids (pad 0, unk 1, bos 2, eos 3)."""
    text = []
    for lang in ("en", "de"):
        with open(os.path.join(SHARED_DATA, "multi30k", f"train.{lang}"), encoding="utf-8") as f:
            text += list(itertools.islice(f, lines))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=320, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def spm_model():
    return train_sentencepiece()


@pytest.fixture(scope="module")
def translator(spm_model):
    tf.random.set_seed(3)
    model = Transformer.from_preset("tiny", vocab_size=320, max_length=MAX_LENGTH)
    return Translator(model, spm_model, beam_size=3, extra_length=4, max_batch_size=3)


@pytest.fixture(scope="module")
def export_dir(translator, tmp_path_factory):
    base = tmp_path_factory.mktemp("saved_models") / "tiny"
    export_translator(translator, str(base), config={"src": "en", "tgt": "de"})
    return str(base)


def _strings(output):
    return [t.decode("utf-8") for t in output["translation"].numpy()]  # strict UTF-8


def test_any_input_gives_one_valid_utf8_output_in_order(translator):
    out = translator(tf.constant(ROBUST_INPUTS))
    assert len(_strings(out)) == len(ROBUST_INPUTS)
    assert np.all(np.isfinite(out["score"].numpy()))
    empty = translator(tf.constant([], tf.string))
    assert empty["translation"].shape == (0,) and empty["score"].shape == (0,)


def test_long_input_is_cut_to_the_model_positions(translator):
    ids = translator.tokenize(tf.constant([b"word " * 20000, b""]))
    assert ids.row_lengths().numpy().tolist() == [MAX_LENGTH, 1]
    assert ids[0, -1] == EOS_ID and ids[1, 0] == EOS_ID


def test_outputs_come_back_in_input_order(translator):
    texts = [b"A man.", b"A dog runs in the park.", b"Two", b"A woman sings a song loudly.",
             b"Children play.", b"Ein Hund", b"Zwei Frauen gehen."]
    out = translator(tf.constant(texts))
    permutation = [3, 0, 6, 2, 5, 1, 4]
    shuffled = translator(tf.constant([texts[i] for i in permutation]))
    assert [_strings(shuffled)[permutation.index(i)] for i in range(7)] == _strings(out)


def test_translation_is_beam_search_between_python_sentencepiece(translator, spm_model):
    """In-graph tokenize/detokenize agree with the sentencepiece library around the search."""
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    text = "A little girl climbs into a wooden playhouse."
    source = tf.constant([processor.encode(text) + [EOS_ID]])
    best = beam_search(translator.model, source, beam_size=3, alpha=0.6, extra_length=4)
    ids = best.ids[0, 0, : int(best.lengths[0, 0])].numpy().tolist()
    expected = processor.decode([i for i in ids if i != EOS_ID])
    out = translator(tf.constant([text]))
    assert _strings(out) == [expected]
    np.testing.assert_allclose(out["score"][0], best.scores[0, 0], rtol=1e-5)


def test_options_signature(translator, spm_model):
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    text = "Two men are playing football."
    greedy = greedy_decode(translator.model, tf.constant([processor.encode(text) + [EOS_ID]]),
                           extra_length=2)
    ids = greedy.ids[0, : int(greedy.lengths[0])].numpy().tolist()
    out = translator.translate_with_options(tf.constant([text]), 1, 0.0, 2)
    assert _strings(out) == [processor.decode([i for i in ids if i != EOS_ID])]
    for options, name in (((0, 0.6, 2), "beam_size"), ((2, -1.0, 2), "alpha"),
                          ((2, 0.6, -1), "extra_length")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"`{name}` must be"):
            translator.translate_with_options(tf.constant([text]), *options)


def test_bad_constructor_arguments_are_named(spm_model):
    model = Transformer.from_preset("tiny", vocab_size=320)
    with pytest.raises(ValueError, match="beam_size.*0"):
        Translator(model, spm_model, beam_size=0)
    with pytest.raises(ValueError, match="alpha.*-1"):
        Translator(model, spm_model, alpha=-1)
    with pytest.raises(ValueError, match="sentencepiece_model.*str"):
        Translator(model, "spm.model")


def test_export_layout_versions_and_assets(translator, export_dir):
    assert sorted(os.listdir(export_dir)) == ["1"]  # no staging dir left
    version = os.path.join(export_dir, "1")
    assert {"saved_model.pb", "variables", "assets"} <= set(os.listdir(version))
    with open(os.path.join(version, "assets", "spm.model"), "rb") as f:
        assert f.read() == translator.sentencepiece_model
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["src"] == "en" and config["model"]["max_positions"] == MAX_LENGTH
    assert config["decoding"]["beam_size"] == 3 and config["decoding"]["extra_length"] == 4
    os.makedirs(os.path.join(export_dir, "7"))
    try:
        assert next_version(export_dir) == 8
        with pytest.raises(FileExistsError, match="7"):
            export_translator(translator, export_dir, version=7)
    finally:
        os.rmdir(os.path.join(export_dir, "7"))


FRESH_PROCESS = textwrap.dedent("""
    import base64, json, sys
    sys.modules["tfxformer"] = None  # importing tfxformer here must fail
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry

    path, inputs = sys.argv[1], [base64.b64decode(t) for t in json.load(sys.stdin)]
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

    model = tf.saved_model.load(path)
    out = model.signatures["serving_default"](text=tf.constant(inputs))
    options = model.signatures["translate_with_options"](
        text=tf.constant(inputs), beam_size=tf.constant(1), alpha=tf.constant(0.0),
        extra_length=tf.constant(2))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:  # as TF Serving loads
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        fetched = session.run(signature.outputs["translation"].name,
                              {signature.inputs["text"].name: inputs})
    print(json.dumps({
        "core": sorted(core), "text": sorted(text), "unknown": sorted(ops - core - text),
        "translation": [t.decode("utf-8") for t in out["translation"].numpy()],
        "score": out["score"].numpy().tolist(),
        "options": [t.decode("utf-8") for t in options["translation"].numpy()],
        "session": [t.decode("utf-8") for t in fetched],
        "tfxformer_loaded": any(m.startswith("tfxformer") for m in sys.modules
                                if sys.modules[m] is not None)}))
""")


def _run(args, **kwargs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(args, capture_output=True, env=env, timeout=240, **kwargs)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result.stdout.decode("utf-8")


@pytest.fixture(scope="module")
def fresh_process(export_dir):
    """Loads the export in a process that imports only tensorflow and tensorflow_text."""
    inputs = json.dumps([base64.b64encode(t).decode() for t in ROBUST_INPUTS])
    stdout = _run([sys.executable, "-c", FRESH_PROCESS, os.path.join(export_dir, "1")],
                  input=inputs.encode())
    return json.loads(stdout.strip().splitlines()[-1])


def test_fresh_process_gives_the_in_process_strings(fresh_process, translator):
    assert not fresh_process["tfxformer_loaded"]
    expected = translator(tf.constant(ROBUST_INPUTS))
    assert fresh_process["translation"] == _strings(expected)
    assert fresh_process["session"] == _strings(expected)  # session loader, as TF Serving
    np.testing.assert_allclose(fresh_process["score"], expected["score"], rtol=1e-5)
    options = translator.translate_with_options(tf.constant(ROBUST_INPUTS), 1, 0.0, 2)
    assert fresh_process["options"] == _strings(options)


def test_graph_uses_only_core_and_tensorflow_text_ops(fresh_process):
    assert fresh_process["unknown"] == []
    assert {"SentencepieceOp", "SentencepieceTokenizeOp"} <= set(fresh_process["text"])
    assert all(op.startswith("Sentencepiece") for op in fresh_process["text"])
    assert {"While", "TopKV2", "UnicodeTranscode"} <= set(fresh_process["core"])


def test_saved_model_cli_show_and_run(export_dir):
    version = os.path.join(export_dir, "1")
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = _run([cli, "show", "--dir", version, "--all"])
    for expected in ("signature_def['serving_default']", "inputs['text']", "DT_STRING",
                     "outputs['translation']", "outputs['score']", "DT_FLOAT",
                     "signature_def['translate_with_options']", "inputs['beam_size']",
                     "inputs['alpha']", "inputs['extra_length']"):
        assert expected in shown, expected
    # `run` needs the tensorflow-text ops registered first (docs/serving.md).
    run_cli = ("import sys, tensorflow_text; from tensorflow.python.tools.saved_model_cli "
               "import main; sys.argv[0] = 'saved_model_cli'; sys.exit(main())")
    ran = _run([sys.executable, "-c", run_cli, "run", "--dir", version, "--tag_set", "serve",
                "--signature_def", "serving_default", "--input_exprs", 'text=["A dog.", ""]'])
    assert "Result for output key translation" in ran and "Result for output key score" in ran


def load_script(name):
    """scripts/<name>.py as a module (its functions, without running main)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_translate_script_end_to_end(export_dir, translator):
    """stdin -> stdout through the export; equal to the same batches translated here."""
    lines = [b"A dog runs.", b"", b"\xff\xfe bad bytes", "😀 日本語".encode(), b"Two men."] * 3
    stdout = _run([sys.executable, os.path.join(ROOT, "scripts", "translate.py"), "--model",
                   export_dir, "--batch-size", "4"], input=b"\n".join(lines) + b"\n")

    def translate(batch):  # the export's defaults: beam 3, alpha 0.6, extra length 4
        return _strings(translator.translate_with_options(tf.constant(batch), 3, 0.6, 4))

    expected = load_script("translate").translate_stream(translate, lines, 4)
    expected = [t.replace("\r", " ").replace("\n", " ") for t in expected]
    assert stdout.split("\n")[:-1] == expected and stdout.endswith("\n")
    assert len(set(stdout.split("\n")[0:15:5])) == 1  # the same line, three times
