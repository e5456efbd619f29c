"""tfxformer.serving: trained run dirs, attention plots, script errors, the serving client."""

import concurrent.futures
import http.server
import json
import logging
import os
import re
import shutil
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import tiny_export_translator
from support.serving import ROBUST_INPUTS, load_script

from tfxformer import Transformer, locate
from tfxformer.analysis import plot_attention, sentence_attention
from tfxformer.pretrained import load_run_dir
from tfxformer.rundir import find_checkpoint, read_config, untracked_weights
from tfxformer.serving import (
    Translator,
    export_run_dir,
    load_translate_fn,
    resolve_model_dir,
)


def _tiny(**overrides):
    return Transformer.from_preset("tiny", vocab_size=320, max_positions=40, **overrides)


@pytest.fixture(scope="module")
def run_dir(spm_model, tmp_path_factory):
    """A run dir as training writes it: config.json, spm.model, checkpoints/ckpt-<step>
    and the state file naming it."""
    path = tmp_path_factory.mktemp("run")
    model = _tiny()
    model.build()
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                     step=tf.Variable(3, tf.int64))
    tf.train.CheckpointManager(checkpoint, str(path / "checkpoints"), max_to_keep=3,
                               checkpoint_name="ckpt").save(checkpoint_number=3)
    (path / "spm.model").write_bytes(spm_model)
    (path / "config.json").write_text(json.dumps(
        {"model": model.model_config.to_dict(), "src": "en", "tgt": "de", "max_length": 40}))
    return str(path), model


def test_checkpoint_reaches_every_model_weight():
    """Keras 3 hides layers kept in Python lists from tf.train.Checkpoint; ours are not."""
    model = _tiny()
    model.build()
    assert untracked_weights(model) == []


def test_load_run_dir_restores_the_trained_weights(run_dir, spm_model):
    path, trained = run_dir
    model, record, spm_bytes = load_run_dir(Transformer, path)
    assert record.src == "en" and spm_bytes == spm_model
    assert record.model == model.model_config and record.to_dict() == read_config(path)
    source, target = tf.constant([[7, 8, 9, 3]]), tf.constant([[2, 10, 11]])
    np.testing.assert_allclose(model((source, target)), trained((source, target)), atol=1e-6)


def test_a_config_of_either_position_argument_name_loads(run_dir, tmp_path):
    """Run dirs written before the position table was called `max_positions` name it
    `max_length` in config.json's "model" (and the other way round): both load."""
    path, trained = run_dir
    config = read_config(path)
    model = config["model"]
    name = "max_positions" if "max_positions" in model else "max_length"
    model["max_length" if name == "max_positions" else "max_positions"] = model.pop(name)
    shutil.copytree(path, tmp_path / "old")
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    loaded, _, _ = load_run_dir(Transformer, str(tmp_path / "old"))
    assert loaded.model_config == trained.model_config


def test_bf16_run_dir_computes_in_bfloat16_with_the_same_weights(run_dir):
    """The bf16 export of a run dir (its compute dtype in config.json, its translations):
    test_shortlist.py's test_export_script_bf16_shortlist_then_re_export."""
    path, trained = run_dir
    model, _, _ = load_run_dir(Transformer, path, precision="bf16")
    assert model.compute_dtype == "bfloat16" and model.variable_dtype == "float32"
    for got, want in zip(model.weights, trained.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(ValueError, match="precision 'int4'.*bf16"):
        load_run_dir(Transformer, path, precision="int4")


@pytest.mark.slow
def test_evaluate_script_scores_a_run_dir_in_bf16(run_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "tiny.en").write_text("A dog runs.\nTwo men talk.\n")
    (data / "tiny.de").write_text("Ein Hund rennt.\nZwei Männer reden.\n")
    main = load_script("evaluate").main
    assert main(["--model", run_dir[0], "--data", str(data), "--sets", "tiny",
                 "--precision", "bf16"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    assert [(r["set"], r["decoding"], r["precision"]) for r in rows] == [("tiny", "beam", "bf16")]
    assert main(["--model", str(tmp_path / "missing"), "--data", str(data), "--sets", "tiny"]) == 2


@pytest.mark.slow
def test_evaluate_script_scores_the_multi30k_metric(run_dir, tmp_path, capsys):
    """--metric multi30k: the literature's BLEU against DATA/tok/SET.lc.norm.tok.TGT."""
    from tfxformer import bleu

    data = tmp_path / "data"
    (data / "tok").mkdir(parents=True)
    (data / "tiny.en").write_text("A dog runs.\nTwo men talk.\n")
    (data / "tiny.de").write_text("Ein Hund rennt.\nZwei Männer reden.\n")
    main = load_script("evaluate").main
    args = ["--model", run_dir[0], "--data", str(data), "--sets", "tiny", "--metric",
            "multi30k", "--hyp-dir", str(tmp_path / "hyps")]
    assert main(args) == 2 and "tok/tiny.lc.norm.tok.de" in capsys.readouterr().err
    (data / "tok" / "tiny.lc.norm.tok.de").write_text("ein hund rennt .\nzwei männer reden .\n")
    assert main(args) == 0
    out = capsys.readouterr().out
    row = next(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    hyps = (tmp_path / "hyps" / "tiny.beam.de").read_text().splitlines()
    refs = (data / "tok" / "tiny.lc.norm.tok.de").read_text().splitlines()
    assert row["bleu_multi30k"] == bleu.multi30k_bleu(hyps, refs, "de")
    assert "| multi30k |" in out and "sacreBLEU signature: nrefs:1" in out
    assert main(args[:-4] + ["--metric", "tokenized"]) == 0
    row = next(json.loads(line) for line in capsys.readouterr().out.splitlines()
               if line.startswith("{"))
    assert row["bleu_tokenized"] == bleu.tokenized_bleu(hyps, ["Ein Hund rennt.",
                                                               "Zwei Männer reden."])


def test_a_checkpoint_of_another_model_is_refused(run_dir, tmp_path):
    path, _ = run_dir
    config = read_config(path)
    config["model"]["num_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "spm.model").write_bytes(open(os.path.join(path, "spm.model"), "rb").read())
    with pytest.raises(ValueError, match="does not match"):
        load_run_dir(Transformer, str(tmp_path),
                     checkpoint=os.path.join(path, "checkpoints", "ckpt-3"))


@pytest.mark.slow
def test_run_dir_export_and_translate_script_agree(run_dir, tmp_path):
    """A run dir's export and the run dir itself translate alike. The export holds
    serving_default alone (what is read here); conftest's `tiny_export` is the full
    six-signature export."""
    path, _ = run_dir
    model, _, spm_bytes = load_run_dir(Transformer, path)
    texts = [b"A dog runs.", b"", b"\xff bad", "Zwei Männer".encode()]
    expected = Translator(model, spm_bytes, beam_size=2, extra_length=3)(tf.constant(texts))
    version = export_run_dir(path, str(tmp_path / "export"), beam_size=2, extra_length=3,
                             signatures=["serving_default"])
    exported = tf.saved_model.load(version).signatures["serving_default"](text=texts)
    assert exported["translation"].numpy().tolist() == expected["translation"].numpy().tolist()
    translate = load_translate_fn(path, beam_size=2, alpha=0.6, extra_length=3, batch_size=3)
    assert translate(texts) == [t.decode() for t in expected["translation"].numpy()]
    assert (translate.kind, translate.path) == ("run_dir", path)
    exported = load_translate_fn(str(tmp_path / "export"), batch_size=3)  # its options
    assert exported(texts) == translate(texts) and exported.options == translate.options
    assert exported.kind == "saved_model" and exported.path == version
    with pytest.raises(ValueError, match="`precision` 'bf16' applies to run dirs"):
        load_translate_fn(version, precision="bf16")


@pytest.mark.slow
def test_plot_attention_script(run_dir, tmp_path):
    output = tmp_path / "attention.png"
    load_script("plot_attention").main(["--model", run_dir[0], "--text", "A dog.", "-o",
                                        str(output), "--kinds", "cross", "--layers", "1"])
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_checkpoint(folder, step, named=True):
    """Empty files of a complete checkpoint `folder/ckpt-<step>`, named by the state file."""
    folder.mkdir(exist_ok=True)
    for suffix in (".index", ".data-00000-of-00001"):
        (folder / f"ckpt-{step}{suffix}").touch()
    if named:
        tf.compat.v1.train.update_checkpoint_state(str(folder), str(folder / f"ckpt-{step}"))


def test_find_checkpoint_takes_the_state_files_averaged_first(tmp_path, caplog, monkeypatch):
    """One rule for "the newest": the state file's; a checkpoint whose files are complete
    but which no state file names (a save cut short) is never loaded."""
    monkeypatch.setattr(logging.getLogger("tfxformer"), "propagate", True)  # training's off
    assert find_checkpoint(str(tmp_path)) is None
    _fake_checkpoint(tmp_path / "checkpoints", 9)
    _fake_checkpoint(tmp_path / "checkpoints", 12, named=False)
    assert find_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoints" / "ckpt-9")
    _fake_checkpoint(tmp_path / "averaged", 7, named=False)  # no state file: ignored
    assert find_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoints" / "ckpt-9")
    _fake_checkpoint(tmp_path / "averaged", 8)
    with caplog.at_level("WARNING", logger="tfxformer"):
        assert find_checkpoint(str(tmp_path)) == str(tmp_path / "averaged" / "ckpt-8")
    assert "averaged before the newer" in caplog.text and "checkpoints/ckpt-9" in caplog.text


def test_resolve_model_dir(tmp_path, tiny_config):
    export = tmp_path / "export"
    config = json.dumps({"model": tiny_config.to_dict(), "src": "en", "tgt": "de"})
    for version in (1, 3, 10):
        (export / str(version) / "assets").mkdir(parents=True)
        (export / str(version) / "saved_model.pb").touch()
        (export / str(version) / "assets" / "config.json").write_text(config)
        (export / str(version) / "assets" / "spm.model").touch()
    (export / "12").mkdir()  # no saved_model.pb: not a version
    assert resolve_model_dir(str(export)) == ("saved_model", str(export / "10"))
    assert resolve_model_dir(str(export / "3")) == ("saved_model", str(export / "3"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(config)
    assert resolve_model_dir(str(tmp_path / "run")) == ("run_dir", str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_dir(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a model of this package: it holds nothing.*"
                                         "; expected a SavedModel"):
        resolve_model_dir(str(export / "12"))


def _write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_each_form_resolves_to_its_loader(tmp_path, tiny_config):
    """locate.resolve gives one loader class per form, read from file names and JSON
    alone; each loads what its form holds and refuses the rest, naming the forms."""
    model = tiny_config.to_dict()
    record = json.dumps({"model": model, "src": "en", "tgt": "de"})
    _write(tmp_path / "run" / "config.json", record)
    for name, config in (("export", record), ("ensemble", json.dumps(
            {"model": model, "src": "en", "tgt": "de",
             "ensemble": [{"source": "a"}, {"source": "b"}]}))):
        for file, text in (("saved_model.pb", ""), ("assets/config.json", config),
                           ("assets/spm.model", "")):
            _write(tmp_path / name / "2" / file, text)
    _write(tmp_path / "preset" / "config.json", json.dumps(
        {"registered_name": locate.REGISTERED_NAME, "config": model}))
    _write(tmp_path / "preset" / locate.WEIGHTS_FILENAME)
    _write(tmp_path / "ct2" / "model.bin")
    _write(tmp_path / "ct2" / "config.json", "{}")
    _write(tmp_path / "ct2" / locate.CT2_MARKER_FILENAME, json.dumps(
        {"format": locate.CT2_FORMAT, "format_version": 1, "model": model}))
    loaders = {"run": locate.RunDirLoader, "export": locate.SavedModelLoader,
               "ensemble": locate.EnsembleLoader, "preset": locate.PresetLoader,
               "ct2": locate.CTranslate2Loader}
    for name, cls in loaders.items():
        loader = locate.resolve(tmp_path / name)
        assert type(loader) is cls and loader.model == tiny_config, name
    assert locate.resolve(tmp_path / "export").path == str(tmp_path / "export" / "2")
    assert locate.resolve(tmp_path / "run").load_settings("bf16") == {
        "precision": "bf16", "checkpoint": None}
    assert locate.resolve(tmp_path / "export").load_settings("bf16") == {}
    assert "constraints" in locate.resolve(tmp_path / "ct2").lacks
    for name in ("ensemble", "ct2"):
        with pytest.raises(ValueError, match="not the weights of one model; expected a "
                                             "SavedModel .*, a run dir .*, or a preset dir"):
            locate.resolve(tmp_path / name).load_model(Transformer)
    with pytest.raises(ValueError, match="`checkpoint` applies to a run dir; .* is a preset"):
        locate.resolve(tmp_path / "preset").load_model(Transformer, checkpoint="ckpt-1")
    with pytest.raises(ValueError, match=r"\['precision'\] apply to SavedModels"):
        locate.resolve(tmp_path / "ct2").open(None, precision="bf16")
    with pytest.raises(ValueError, match="`threads` 2 applies to CTranslate2"):
        locate.resolve(tmp_path / "export").open(None, threads=2)
    _write(tmp_path / "other" / "notes.txt")
    accepted = ("a SavedModel export dir .*, a run dir .*, a preset dir .*, an ensemble "
                "export .*, or a CTranslate2 dir")
    with pytest.raises(ValueError, match="it holds notes.txt; expected " + accepted):
        locate.resolve(tmp_path / "other")
    with pytest.raises(ValueError, match="'.*ct2' is a CTranslate2 dir; expected a "
                                         "SavedModel .*, or a run dir"):
        locate.resolve(tmp_path / "ct2", locate.ONE_MODEL[:2], "a tool")


def test_run_config_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="No config.json"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text('{"src": "en"}')
    with pytest.raises(ValueError, match="vocab_size.*'src'"):
        read_config(str(tmp_path))


def test_translate_script_errors_for_bad_model_dirs(run_dir, tmp_path, capsys):
    main = load_script("translate").main
    (tmp_path / "empty").mkdir()
    no_checkpoint = tmp_path / "no_checkpoint"
    no_checkpoint.mkdir()
    for name in ("config.json", "spm.model"):
        (no_checkpoint / name).write_bytes(open(os.path.join(run_dir[0], name), "rb").read())
    for model_dir, message in ((tmp_path / "missing", "does not exist"),
                               (tmp_path / "empty", "is not a model of this package"),
                               (no_checkpoint, "No checkpoint")):
        with pytest.raises(SystemExit) as exit_info:
            main(["--model", str(model_dir)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_plot_attention_draws_every_layer_and_head(spm_model, tmp_path):
    model = _tiny()
    attention = sentence_attention(model, spm_model, "A dog runs $5 😀", extra_length=3)
    source, target = len(attention.source_tokens), len(attention.target_tokens)
    assert attention.source_tokens[-1] == "</s>" and target <= source + 3
    assert attention.decoder_input_tokens[0] == "<s>"
    for kind, shape in (("encoder", (4, source, source)), ("decoder", (4, target, target)),
                        ("cross", (4, target, source))):
        assert len(attention.weights[kind]) == 2  # layers
        for weights in attention.weights[kind]:
            assert weights.shape == shape
            np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)
    path = plot_attention(attention, str(tmp_path / "attention.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="kinds.*accepted"):
        plot_attention(attention, str(tmp_path / "x.png"), kinds=("self",))


@pytest.fixture(scope="module")
def served(tiny_export, spm_model):
    """conftest's tiny export loaded as a server would: (loaded SavedModel, in-process
    translator)."""
    return tf.saved_model.load(tiny_export), tiny_export_translator(tiny_export, spm_model)


def _call_signature(loaded, name, inputs):
    function = loaded.signatures[name]
    specs = function.structured_input_signature[1]
    out = function(**{k: tf.constant(v, specs[k].dtype) for k, v in inputs.items()})
    return [t.decode() for t in out["translation"].numpy()], out["score"].numpy().tolist()


class _FakeRestServing(http.server.BaseHTTPRequestHandler):
    """TF Serving's REST predict API (columnar "inputs" -> "outputs") over one SavedModel."""

    loaded = None

    def do_POST(self):  # noqa: N802 (http.server's name)
        match = re.fullmatch(r"/v1/models/(\w+)(/versions/\d+)?:predict", self.path)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not match or match.group(1) != "tiny":
            return self._reply(404, {"error": "Servable not found for request"})
        translations, scores = _call_signature(
            self.loaded, body.get("signature_name", "serving_default"), body["inputs"])
        self._reply(200, {"outputs": {"translation": translations, "score": scores}})

    def _reply(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_serving_client_rest(served, tiny_export):
    loaded, translator = served
    _FakeRestServing.loaded = loaded
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeRestServing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client, port = load_script("serving_client"), server.server_address[1]
    try:
        texts = [t.decode("utf-8", "replace") for t in ROBUST_INPUTS[:12]]
        translations, scores = client.predict_rest(texts, "tiny", "127.0.0.1", port)
        expected = translator(tf.constant(texts))
        assert translations == [t.decode() for t in expected["translation"].numpy()]
        np.testing.assert_allclose(scores, expected["score"], rtol=1e-5)
        # Options go to the batchable signature; the unset ones are the export's.
        defaults = client.export_options(tiny_export)
        assert client.export_options(os.path.dirname(tiny_export)) == defaults
        greedy, _ = client.predict_rest(texts, "tiny", "127.0.0.1", port, version=1,
                                        options={"beam_size": 1}, defaults=defaults)
        options = translator.translate_with_options(tf.constant(texts), 1, translator.alpha,
                                                    translator.extra_length)
        assert greedy == [t.decode() for t in options["translation"].numpy()]
        assert client.request_inputs(texts, {"beam_size": 1}, defaults)[0] == (
            "translate_per_example")
        with pytest.raises(ValueError, match="--alpha, --extra-length not given.*--export"):
            client.predict_rest(texts, "tiny", "127.0.0.1", port, options={"beam_size": 1})
        with pytest.raises(RuntimeError, match="HTTP 404.*Servable not found"):
            client.predict_rest(texts, "other", "127.0.0.1", port)
    finally:
        server.shutdown()


def test_serving_client_grpc_says_how_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tensorflow_serving", None)
    with pytest.raises(RuntimeError, match="pip install tensorflow-serving-api"):
        load_script("serving_client").predict_grpc(["A dog."], "tiny")


@pytest.mark.slow
def test_serving_client_grpc(served, tiny_export):
    grpc = pytest.importorskip("grpc")
    apis = pytest.importorskip("tensorflow_serving.apis.prediction_service_pb2_grpc")
    from tensorflow_serving.apis import predict_pb2

    loaded, translator = served

    class Servicer(apis.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802 (gRPC's name)
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            translations, scores = _call_signature(loaded, request.model_spec.signature_name,
                                                   inputs)
            response = predict_pb2.PredictResponse()
            response.outputs["translation"].CopyFrom(tf.make_tensor_proto(translations))
            response.outputs["score"].CopyFrom(tf.make_tensor_proto(scores, tf.float32))
            return response

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    apis.add_PredictionServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = load_script("serving_client")
        texts = ["A dog runs.", "", "😀"]
        translations, _ = client.predict_grpc(texts, "tiny", "127.0.0.1", port,
                                              options={"extra_length": 2},
                                              defaults=client.export_options(tiny_export))
        expected = translator.translate_with_options(tf.constant(texts), translator.beam_size,
                                                     translator.alpha, 2)
        assert translations == [t.decode() for t in expected["translation"].numpy()]
    finally:
        server.stop(0)


def test_export_script_help_explains_every_flag(capsys):
    parser = load_script("export").build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    shown = capsys.readouterr().out
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in shown
        assert action.help, action.option_strings


@pytest.mark.slow
def test_export_script_run_dir_then_re_export_of_the_saved_model(run_dir, tmp_path):
    """Limits and search rules from the flags land in the config asset; re-exporting a
    version's variables keeps every decoding option no flag sets (a flag wins) and gives
    a new version that translates as the first one does with those options.

    Each version holds only the signatures read here (--signatures: translate_with_options
    in the first, serving_default alone in the second); conftest's `tiny_export` is the
    full six-signature export the other tests serve."""
    main = load_script("export").main
    base = str(tmp_path / "export")
    assert main(["--model", run_dir[0], "--export-dir", base, "--beam-size", "2",
                 "--alpha", "1.3", "--extra-length", "3", "--max-input-tokens", "12",
                 "--batch-threads", "3", "--stopping", "finished",
                 "--signatures", "translate_with_options"]) == 0
    first = os.path.join(base, "1")
    with open(os.path.join(first, "assets", "config.json"), encoding="utf-8") as f:
        decoding = json.load(f)["decoding"]
    assert (decoding["max_input_tokens"], decoding["max_output_tokens"]) == (12, 40)
    assert (decoding["stopping"], decoding["length_normalization"]) == ("finished", "gnmt")
    with open(os.path.join(first, "assets.extra", "batching_parameters.txt"),
              encoding="utf-8") as f:
        assert "num_batch_threads { value: 3 }" in f.read()
    assert main(["--model", first, "--export-dir", base, "--alpha", "0.6",  # a flag wins
                 "--signatures", "serving_default"]) == 0
    with open(os.path.join(base, "2", "assets", "config.json"), encoding="utf-8") as f:
        assert json.load(f)["decoding"] == dict(decoding, alpha=0.6)  # the others: first's
    texts = tf.constant(["A dog runs.", "", "Zwei Männer " * 9])
    loaded = [tf.saved_model.load(os.path.join(base, v)) for v in ("1", "2")]
    outs = [loaded[0].signatures["translate_with_options"](
                text=texts, beam_size=tf.constant(2), alpha=tf.constant(0.6),
                extra_length=tf.constant(3)),
            loaded[1].signatures["serving_default"](text=texts)]
    for key in ("translation", "truncated"):
        assert outs[0][key].numpy().tolist() == outs[1][key].numpy().tolist()
    assert outs[0]["truncated"].numpy().tolist() == [False, False, True]
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", first, "--export-dir", base, "--checkpoint", "x"])
    assert exit_info.value.code == 2


def test_run_record_reads_old_layouts_and_round_trips():
    """An export asset of an earlier version: old decoding names, the languages and the
    length filter only under "train", the position table under its old name."""
    from tfxformer.rundir import RunRecord

    old = {"model": {"vocab_size": 320, "num_layers": 2, "d_model": 32, "num_heads": 4,
                     "d_ff": 64, "max_length": 40},
           "train": {"src": "en", "tgt": "fr", "max_length": 30, "data": "multi30k"},
           "decoding": {"beam_size": 3, "alpha": 1.0, "extra_length": 5, "max_batch_size": 8,
                        "max_input_length": 20, "max_output_tokens": 20},
           "precision": "fp32", "shortlist": None}
    record = RunRecord.from_dict(old)
    assert (record.model.max_positions, record.src, record.tgt, record.max_length) == \
        (40, "en", "fr", 30)
    assert (record.decoding.batch_size, record.decoding.max_input_tokens) == (8, 20)
    assert record.training_data() == "multi30k" and record.export["precision"] == "fp32"
    assert RunRecord.from_dict(record.to_dict()) == record
    with pytest.raises(ValueError, match="Keys \\['sourc'\\] are not part of"):
        RunRecord.from_dict({**old, "sourc": "en"})
