"""tfxformer.serving: in-graph translation, SavedModel export, and what serves it."""

import base64
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS, TINY_EXPORT_POSITIONS, tiny_export_translator
from support.environment import CALLER_ENV, TEST_ENV
from support.serving import (
    FRESH_PROCESS,
    ROBUST_INPUTS,
    load_script,
    run_checked,
    run_script,
)
from support.steering import cleaned
from tensorflow.core.protobuf import saved_model_pb2

from tfxformer import Transformer
from tfxformer.decoding import EOS_ID, beam_search, greedy_decode
from tfxformer.serving import Translator, export_translator, next_version

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def translator(tiny_export, spm_model):
    """conftest's tiny export in process: an untrained tiny model (MAX_LENGTH positions),
    beam 3, extra length 4, chunks of 3."""
    assert (TINY_EXPORT_POSITIONS, TINY_EXPORT_OPTIONS) == (
        MAX_LENGTH, dict(beam_size=3, extra_length=4, max_batch_size=3))
    return tiny_export_translator(tiny_export, spm_model)


@pytest.fixture(scope="module")
def export_dir(tiny_export):
    """The export of `translator` (conftest's tiny export; read-only): its base dir."""
    return os.path.dirname(tiny_export)


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
    expected = cleaned(processor.decode([i for i in ids if i != EOS_ID]))  # as served
    out = translator(tf.constant([text]))
    assert _strings(out) == [expected]
    np.testing.assert_allclose(out["score"][0], best.scores[0, 0], rtol=1e-5)


def test_translator_fixes_the_stopping_rule_and_length_normalization(translator, spm_model):
    """Translator(stopping=..., length_normalization=...) decodes as beam_search with them
    (the score divided by |Y|^α, not lp(Y)) and keeps them in its options (config.json)."""
    rules = dict(stopping="finished", length_normalization="length")
    ended = Translator(translator.model, spm_model, beam_size=3, extra_length=4, **rules)
    assert {k: ended.options.to_dict()[k] for k in rules} == rules
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    text = "Two dogs run on the beach."
    best = beam_search(translator.model, tf.constant([processor.encode(text) + [EOS_ID]]),
                       beam_size=3, alpha=0.6, extra_length=4, **rules)
    ids = best.ids[0, 0, : int(best.lengths[0, 0])].numpy().tolist()
    out = ended(tf.constant([text]))
    assert _strings(out) == [cleaned(processor.decode([i for i in ids if i != EOS_ID]))]
    np.testing.assert_allclose(out["score"][0], best.scores[0, 0], rtol=1e-5)
    with pytest.raises(ValueError, match="`stopping` must be one of 'bound', 'finished'"):
        Translator(translator.model, spm_model, stopping="early")


def test_options_signature(translator, spm_model):
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    text = "Two men are playing football."
    greedy = greedy_decode(translator.model, tf.constant([processor.encode(text) + [EOS_ID]]),
                           extra_length=2)
    ids = greedy.ids[0, : int(greedy.lengths[0])].numpy().tolist()
    out = translator.translate_with_options(tf.constant([text]), 1, 0.0, 2)
    assert _strings(out) == [cleaned(processor.decode([i for i in ids if i != EOS_ID]))]
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


def test_export_layout_versions_and_assets(translator, export_dir, tmp_path):
    assert sorted(os.listdir(export_dir)) == ["1"]  # no staging dir left
    version = os.path.join(export_dir, "1")
    assert {"saved_model.pb", "variables", "assets"} <= set(os.listdir(version))
    with open(os.path.join(version, "assets", "spm.model"), "rb") as f:
        assert f.read() == translator.sentencepiece_model
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["src"] == "en" and config["model"]["max_positions"] == MAX_LENGTH
    assert config["decoding"]["beam_size"] == 3 and config["decoding"]["extra_length"] == 4
    export_dir = str(shutil.copytree(export_dir, tmp_path / "tiny"))  # the shared one stays
    os.makedirs(os.path.join(export_dir, "7"))
    assert next_version(export_dir) == 8
    with pytest.raises(FileExistsError, match="7"):
        export_translator(translator, export_dir, version=7)


@pytest.fixture(scope="module")
def fresh_process(export_dir):
    """Loads the export in a process that imports only tensorflow and tensorflow_text
    (tensorflow-serving-api's protos for the warm-up records), started as a user starts one
    (run_checked): every signature, the session loader with the warm-up replay, and
    saved_model_cli; one process start for them all."""
    inputs = json.dumps([base64.b64encode(t).decode() for t in ROBUST_INPUTS])
    stdout = run_checked([sys.executable, "-c", FRESH_PROCESS, os.path.join(export_dir, "1"),
                   "signatures,replay,cli"], input=inputs.encode())
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.user_env
def test_a_users_process_serves_what_tf_serving_runs_with_the_in_process_strings(
        export_dir, translator):
    """The export in a process started as a user starts one (user_env: TensorFlow's own
    oneDNN and allocator settings, Grappler on), through the session loader TF Serving
    uses (the graph Grappler optimizes), gives the strings and scores of the translator in
    this process (Eigen, Grappler off). The fast tier's check of what serves (about 12 s
    of CPU); the slow tier's fresh_process below runs every signature so."""
    texts = [ROBUST_INPUTS[i] for i in (0, 1, 4, 9, 11, 19)]
    inputs = json.dumps([base64.b64encode(t).decode() for t in texts])
    stdout = run_checked([sys.executable, "-c", FRESH_PROCESS, os.path.join(export_dir, "1"),
                          "session"], input=inputs.encode())
    fresh = json.loads(stdout.strip().splitlines()[-1])
    assert fresh["environment"] == {name: CALLER_ENV[name] for name in TEST_ENV}
    assert not fresh["grappler_off"] and not fresh["tfxformer_loaded"]
    expected = translator(tf.constant(texts))
    assert fresh["session"] == _strings(expected)
    np.testing.assert_allclose(fresh["session_score"], expected["score"], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.user_env
def test_fresh_process_gives_the_in_process_strings(fresh_process, translator):
    assert not fresh_process["tfxformer_loaded"] and not fresh_process["grappler_off"]
    expected = translator(tf.constant(ROBUST_INPUTS))
    assert fresh_process["translation"] == _strings(expected)
    assert fresh_process["session"] == _strings(expected)  # session loader, as TF Serving
    np.testing.assert_allclose(fresh_process["score"], expected["score"], rtol=1e-5)
    options = translator.translate_with_options(tf.constant(ROBUST_INPUTS), 1, 0.0, 2)
    assert fresh_process["options"] == _strings(options)
    assert fresh_process["truncated"] == expected["truncated"].numpy().tolist()
    greedy, beam = _strings(options), _strings(expected)  # the export's options: 3, 0.6, 4
    assert fresh_process["per_example"] == [(greedy, beam)[i % 2][i]
                                            for i in range(len(ROBUST_INPUTS))]
    scored = translator.score(tf.constant(ROBUST_INPUTS), tf.constant(ROBUST_INPUTS[::-1]))
    np.testing.assert_allclose(fresh_process["scored"], scored["log_prob"], rtol=1e-5)
    np.testing.assert_allclose(fresh_process["session_scored"], scored["log_prob"], rtol=1e-5)
    sampled = translator.translate_sampled(tf.constant(ROBUST_INPUTS), 5, 1.0, 0.9, 4,
                                           tf.constant(3, tf.int64))
    assert fresh_process["sampled"] == _strings(sampled)


@pytest.mark.slow
@pytest.mark.user_env
def test_graph_uses_only_core_and_tensorflow_text_ops(fresh_process):
    assert fresh_process["unknown"] == []
    assert {"SentencepieceOp", "SentencepieceTokenizeOp"} <= set(fresh_process["text"])
    # tensorflow-text's SentencePiece ops and its regex split (the reading of paragraphs
    # and markup): the two op libraries a TF Serving build links and the C++ loader loads
    assert {op for op in fresh_process["text"] if not op.startswith("Sentencepiece")} == {
        "RegexSplitWithOffsets"}
    assert {"While", "TopKV2", "UnicodeTranscode"} <= set(fresh_process["core"])


@pytest.mark.slow
@pytest.mark.user_env
def test_saved_model_cli_show_and_run(fresh_process):
    """`saved_model_cli show` and `run` (the console script's main, run in the fresh
    process after tensorflow_text registered its ops, as docs/serving.md says)."""
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    with open(cli, encoding="utf-8") as f:
        assert "from tensorflow.python.tools.saved_model_cli import main" in f.read()
    shown = fresh_process["cli_show"]
    for expected in ("signature_def['serving_default']", "inputs['text']", "DT_STRING",
                     "outputs['translation']", "outputs['score']", "DT_FLOAT",
                     "signature_def['translate_with_options']", "inputs['beam_size']",
                     "inputs['alpha']", "inputs['extra_length']"):
        assert expected in shown, expected
    ran = fresh_process["cli_run"]
    assert "Result for output key translation" in ran and "Result for output key score" in ran


@pytest.mark.slow
def test_translate_script_end_to_end(export_dir, translator):
    """stdin -> stdout through the export; equal to the same batches translated here."""
    lines = [b"A dog runs.", b"", b"\xff\xfe bad bytes", "😀 日本語".encode(), b"Two men."] * 3
    stdout = run_script("translate", ["--model", export_dir, "--batch-size", "4"],
                        stdin=b"\n".join(lines) + b"\n")

    def translate(batch):  # the export's defaults: beam 3, alpha 0.6, extra length 4
        return _strings(translator.translate_with_options(tf.constant(batch), 3, 0.6, 4))

    expected = load_script("translate").translate_stream(translate, lines, 4)
    expected = [t.replace("\r", " ").replace("\n", " ") for t in expected]
    assert stdout.split("\n")[:-1] == expected and stdout.endswith("\n")
    assert len(set(stdout.split("\n")[0:15:5])) == 1  # the same line, three times


def test_blank_inputs_get_empty_translations_inside_a_batch(translator):
    texts = [b"A dog runs.", b"", b"Two men talk.", b" \t ", "\u3000".encode(), b"Children."]
    out = translator(tf.constant(texts))
    assert [_strings(out)[i] for i in (1, 3, 4)] == ["", "", ""]
    assert out["score"].numpy()[[1, 3, 4]].tolist() == [0.0, 0.0, 0.0]
    alone = translator(tf.constant([texts[i] for i in (0, 2, 5)]))
    assert [_strings(out)[i] for i in (0, 2, 5)] == _strings(alone)
    np.testing.assert_allclose(out["score"].numpy()[[0, 2, 5]], alone["score"], rtol=1e-5)


class _ModelThatMustNotRun:
    """The translator's model, but encoding raises: the graph may hold it, never run it."""

    def __init__(self, model):
        self.model, self.built, self.model_config = model, True, model.model_config

    def encode(self, source_ids, **kwargs):
        with tf.control_dependencies([tf.debugging.Assert(False, ["the model ran"])]):
            return self.model.encode(tf.identity(source_ids), **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_blank_inputs_never_reach_the_model(translator, spm_model):
    guarded = Translator(_ModelThatMustNotRun(translator.model), spm_model, beam_size=2)
    out = guarded(tf.constant(["", "  ", "\t"]))
    assert _strings(out) == ["", "", ""] and out["score"].numpy().tolist() == [0.0] * 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="the model ran"):
        guarded(tf.constant(["", "A dog."]))


def test_over_long_inputs_are_cut_and_flagged(translator, spm_model):
    texts = tf.constant([b"word " * 20000, b"A dog runs.", b"", "😀".encode() * 5000])
    assert translator(texts)["truncated"].numpy().tolist() == [True, False, False, True]
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    limited = Translator(translator.model, spm_model, max_input_tokens=6, max_output_tokens=5)
    sentences = ["A dog runs in the park.", "A dog.", "Two"]
    ids = limited.tokenize(tf.constant(sentences))
    assert ids.to_list() == [processor.encode(t)[:5] + [EOS_ID] for t in sentences]
    out = limited(tf.constant(sentences))
    assert out["truncated"].numpy().tolist() == [len(processor.encode(t)) > 5
                                                 for t in sentences]
    assert out["truncated"].numpy().tolist()[0]
    best = beam_search(translator.model, ids.to_tensor(), beam_size=4, alpha=0.6,
                       max_output_length=5)  # the decode limit reaches the search
    expected = limited.detokenize(best.ids[:, 0], best.lengths[:, 0])
    assert _strings(out) == [cleaned(t.decode()) for t in expected.numpy()]
    with pytest.raises(ValueError, match="max_input_tokens.*0"):
        Translator(translator.model, spm_model, max_input_tokens=0)


def test_per_example_options_decode_each_group_with_its_options(translator):
    texts = ["A man.", "A dog runs in the park.", "", "Two women walk.", "Ein Hund"]
    beams, alphas, extras = [1, 3, 3, 1, 3], [0.0, 0.6, 0.6, 0.0, 0.6], [2, 4, 4, 2, 4]
    out = translator.translate_per_example(tf.constant(texts), beams, alphas, extras,
                                           [48, 48, 48, 48, 3])
    greedy = translator.translate_with_options(tf.constant(texts), 1, 0.0, 2)
    beam = translator.translate_with_options(tf.constant(texts), 3, 0.6, 4)
    expected = [_strings(greedy if b == 1 else beam)[i] for i, b in enumerate(beams)]
    assert _strings(out)[:4] == expected[:4]
    assert out["truncated"].numpy().tolist() == [False, False, False, False, True]
    short = translator.translate_per_example(tf.constant(texts[4:]), [3], [0.6], [4], [3])
    assert _strings(out)[4] == _strings(short)[0]
    for options, name in ((([0], [0.6], [2], [9]), "beam_size"),
                          (([2], [-1.0], [2], [9]), "alpha"),
                          (([2], [0.6], [-1], [9]), "extra_length"),
                          (([2], [0.6], [2], [0]), "max_input_tokens"),
                          (([2, 2], [0.6], [2], [9]), "beam_size.*one value per text")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"`{name}"):
            translator.translate_per_example(tf.constant(["A dog."]), *options)


def _signature_defs(version):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(version, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0].signature_def


def test_batchable_signatures_are_batch_major(export_dir):
    """TF Serving batching concatenates requests along dimension 0 of every tensor."""
    from tfxformer.serving.warmup import BATCHABLE_SIGNATURES

    signatures = _signature_defs(os.path.join(export_dir, "1"))
    assert set(BATCHABLE_SIGNATURES) < set(signatures)
    for name in BATCHABLE_SIGNATURES:
        tensors = {**signatures[name].inputs, **signatures[name].outputs}
        assert set(signatures[name].outputs) == {
            "score": {"log_prob", "mean_log_prob", "token_log_probs", "length", "truncated"},
            "translate_nbest": {"translations", "scores", "truncated", "warning", "tokens",
                                "token_log_probs", "alignments"}}.get(
                name, {"translation", "score", "truncated"})
        for key, info in tensors.items():
            dims = [d.size for d in info.tensor_shape.dim]
            assert not info.tensor_shape.unknown_rank and dims[:1] == [-1], (name, key, dims)
    assert set(signatures["translate_per_example"].inputs) == {
        "text", "beam_size", "alpha", "extra_length", "max_input_tokens"}
    scalars = [k for k, v in signatures["translate_with_options"].inputs.items()
               if not v.tensor_shape.dim]
    assert sorted(scalars) == ["alpha", "beam_size", "extra_length"]  # kept as before
    assert set(signatures["score"].inputs) == {"text", "target"}
    assert set(signatures["translate_nbest"].inputs) == {
        "text", "beam_size", "alpha", "extra_length", "max_input_tokens", "num_hypotheses",
        "no_repeat_ngram_size", "repetition_penalty", "target_prefix", "constraints"}
    scalars = [k for k, v in signatures["translate_sampled"].inputs.items()
               if not v.tensor_shape.dim]
    assert sorted(scalars) == ["extra_length", "sampling_temperature", "sampling_topk",
                               "sampling_topp", "seed"]


def test_each_signature_graph_is_saved_once(export_dir):
    """One trace per signature in the function library (a tf.function on the export root
    would be traced again while saving: every graph twice, more memory to load)."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "1", "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    names = [f.signature.name for f in proto.meta_graphs[0].graph_def.library.function]
    for traced in ("__call__", "translate_with_options", "translate_per_example",
                   "translate_sampled", "translate_nbest", "score"):
        assert len([n for n in names if n.startswith(f"__inference_{traced}_")]) == 1, traced


def test_batching_parameters_example(export_dir):
    path = os.path.join(export_dir, "1", "assets.extra", "batching_parameters.txt")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    fields = dict(re.findall(r"^(\w+) \{ value: (\d+) \}$", text, re.M))
    assert fields == {"max_batch_size": "3", "batch_timeout_micros": "1000",
                      "max_enqueued_batches": str(max(4, 4 * os.cpu_count())),
                      "num_batch_threads": str(os.cpu_count())}
    # the server's thread flags that go with it: one batch per core, ops on one thread
    assert (f"--tensorflow_intra_op_parallelism=1 "
            f"--tensorflow_inter_op_parallelism={os.cpu_count()}") in text


@pytest.mark.slow
@pytest.mark.user_env
def test_warmup_records_replay_in_a_fresh_process(fresh_process):
    """The warm-up records through the session loader (as TF Serving replays them)."""
    from tfxformer.serving.warmup import BATCHABLE_SIGNATURES, LONG_TEXT, SHORT_TEXT

    records = fresh_process["replay"]
    assert 0 < len(records) <= 1000 and {r["kind"] for r in records} == {"predict_log"}
    assert {(r["signature"], r["inputs"]["text"][0]) for r in records} == {
        (name, size) for name in BATCHABLE_SIGNATURES for size in (1, 3)}
    assert {tuple(r["text"]) for r in records} >= {(SHORT_TEXT,), (LONG_TEXT,)}
    for record in records:
        size = record["inputs"]["text"][0]
        assert all(dims == [size] for dims in record["inputs"].values()), record["inputs"]
        if record["signature"] == "score":  # each text scored as its own target
            assert record["outputs"].pop("token_log_probs") == [size, max(record["length"])]
            assert record["outputs"] == {k: [size] for k in ("length", "log_prob",
                                                             "mean_log_prob", "truncated")}
            assert (record["length"][-1] == 1) == (size > 1)  # a blank target: EOS alone
            continue
        if record["signature"] == "translate_nbest":  # n-best lists of the beam size
            pieces = record["outputs"].pop("tokens")
            assert pieces[:2] == [size, 3] == record["outputs"].pop("token_log_probs")[:2]
            assert record["outputs"] == {"translations": [size, 3], "scores": [size, 3],
                                         "truncated": [size], "warning": [size],
                                         "alignments": [size, 3]}
            continue
        assert record["outputs"] == {k: [size] for k in ("score", "translation", "truncated")}
        assert (record["translation"][-1] == "") == (size > 1)  # a blank input in the batch


@pytest.mark.slow  # a whole export: 11 s of CPU, among the fast tier's heaviest
def test_the_asset_record_keeps_no_path_of_the_training_machine(translator, tmp_path):
    """An export travels: its config.json has no run or export dir, and an absolute data
    folder is cut to its name (a relative one is kept as given)."""
    train = {"model_dir": "/srv/runs/a", "export_dir": "/srv/exports/a", "data": "/srv/corpus/",
             "tfds_data_dir": "/srv/tfds", "src": "en", "tgt": "de", "train_steps": 10}
    version = export_translator(translator, str(tmp_path / "portable"),
                                config={"src": "en", "tgt": "de", "train": train})
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        record = json.load(f)
    assert record["train"] == {"data": "corpus", "src": "en", "tgt": "de", "train_steps": 10}
    assert "/srv" not in json.dumps(record)
