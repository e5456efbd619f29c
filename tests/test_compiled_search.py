"""The XLA-compiled search of a translator's small chunks (tfxformer.serving.compiled): the
same translations as the graph path, bounded programs, and the export records it."""

import json
import os

import pytest
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS, TINY_EXPORT_POSITIONS

from tfxformer.serving.compiled import CompiledSearch, buckets, shortlist_buckets

TEXTS = ["A dog runs in the park.", "Two men are playing football on a green field.", "x",
         "The small brown dog runs after the ball along the white line near the church."]


def test_buckets():
    assert buckets(128, 16) == (16, 32, 64, 128)
    assert buckets(100, 16) == (16, 32, 64, 100)
    assert buckets(10, 16) == (10,)
    assert buckets(1) == (1,)
    assert buckets(4) == (1, 2, 4)
    with pytest.raises(ValueError, match="limit"):
        buckets(0)


def test_shortlist_buckets_and_padding():
    assert shortlist_buckets(8000) == (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                       6144, 8000)
    assert shortlist_buckets(320) == (256, 320)
    assert shortlist_buckets(100) == (100,)
    from tfxformer.decoding.shortlist import pad_shortlist

    ids, usable = pad_shortlist(tf.constant([0, 1, 2, 3, 5, 9]), 8, 10)
    assert ids.numpy().tolist() == [0, 1, 2, 3, 4, 5, 6, 9]  # sorted unique: a shortlist
    assert usable.numpy().tolist() == [True] * 4 + [False, True, False, True]


def _translators(spm_model, xla_max_batch=1, shortlist=None):
    from tfxformer import Transformer
    from tfxformer.serving import Translator

    tf.random.set_seed(3)
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=TINY_EXPORT_POSITIONS)
    # Sources of at most 16 tokens: one length bucket, so each path compiles one program.
    options = dict(TINY_EXPORT_OPTIONS, max_input_tokens=16)
    graph = Translator(model, spm_model, shortlist=shortlist, **options)
    compiled = Translator(model, spm_model, xla_max_batch=xla_max_batch, shortlist=shortlist,
                          **options)
    return graph, compiled


@pytest.fixture(scope="module")
def translators(spm_model):
    """_translators(spm_model) (xla_max_batch 1, as --xla-max-batch 1 exports), shared by
    the module's tests (each traces its functions once)."""
    return _translators(spm_model)


def test_same_translations_as_the_graph_path(translators):
    graph, compiled = translators
    assert isinstance(compiled.compiled_search, CompiledSearch)
    assert graph.compiled_search is None
    # One sentence runs the compiled search (padded to its bucket), two the graph path
    # (above xla_max_batch; so does a beam size other than the export's: the next test).
    for texts in ([TEXTS[0]], [TEXTS[1]], [TEXTS[2]], [TEXTS[3]], TEXTS[:2]):
        want, got = graph(tf.constant(texts)), compiled(tf.constant(texts))
        assert got["translation"].numpy().tolist() == want["translation"].numpy().tolist()
        assert got["score"].numpy() == pytest.approx(want["score"].numpy(), abs=1e-4)


def test_applies_only_to_the_compiled_options(translators):
    _, compiled = translators
    search = compiled.compiled_search
    source = tf.ones([2, 5], tf.int32)
    assert bool(search.applies(source[:1], dict(beam_size=3, extra_length=4)))
    assert not bool(search.applies(source, dict(beam_size=3, extra_length=4)))
    assert not bool(search.applies(source[:1], dict(beam_size=2, extra_length=4)))
    assert not bool(search.applies(source[:1], dict(beam_size=tf.constant(3),
                                                    extra_length=tf.constant(5))))


@pytest.fixture(scope="module")
def shortlist_table():
    """A table (vocabulary 320) whose shortlists of one sentence fill either of the
    compiled search's shortlist buckets (256, 320): 40 frequent ids, 40 ids drawn at random
    per source token (a sentence of one piece stays under 256 ids, of 15 pieces not)."""
    import numpy as np

    from tfxformer.decoding import ShortlistTable

    rows = np.random.default_rng(0).integers(4, 320, (320, 40)).astype(np.int32)
    return ShortlistTable(rows, np.arange(4, 44, dtype=np.int32), {})


def test_compiled_search_over_a_shortlist_is_the_graph_paths(spm_model, shortlist_table):
    """The compiled search over a lone sentence's shortlist, padded to its bucket (both
    buckets here): the translations and scores of the graph path's search over it."""
    import sentencepiece as spm

    from tfxformer.decoding import beam_search, shortlist_ids

    graph, compiled = _translators(spm_model, shortlist=shortlist_table)
    search = compiled.compiled_search
    assert search.shortlist_buckets == (256, 320) and search.programs == 2
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    sizes = set()
    for text in (TEXTS[2], TEXTS[3]):
        source = tf.constant([processor.encode(text)[:15] + [3]])
        shortlist = shortlist_ids(source, shortlist_table.table, shortlist_table.frequent)
        sizes.add(min(size for size in search.shortlist_buckets if size >= len(shortlist)))
        want = beam_search(graph.model, source, 3, graph.alpha, 4, shortlist=shortlist)
        ids, lengths, scores = search.search(source, graph.alpha, shortlist)
        assert ids.numpy()[0, :lengths[0]].tolist() == \
            want.ids.numpy()[0, 0, :want.lengths[0, 0]].tolist()
        assert scores.numpy() == pytest.approx(want.scores.numpy()[:, 0], abs=1e-4)
    assert sizes == {256, 320}


@pytest.mark.slow  # traces two translators and compiles two programs (~1 min)
def test_translator_with_a_shortlist_runs_the_compiled_search(spm_model, shortlist_table,
                                                             monkeypatch):
    """Search.best sends a lone sentence with its shortlist to the compiled search (one
    sentence in each shortlist bucket), two the graph path: the same translations."""
    graph, compiled = _translators(spm_model, shortlist=shortlist_table)
    search, shortlists = compiled.compiled_search.search, []

    def recorded(source, alpha, shortlist=None):  # called when the translator traces
        shortlists.append(shortlist)
        return search(source, alpha, shortlist)

    monkeypatch.setattr(compiled.compiled_search, "search", recorded)
    for texts in ([TEXTS[2]], [TEXTS[3]], TEXTS[:2]):
        want, got = graph(tf.constant(texts)), compiled(tf.constant(texts))
        assert got["translation"].numpy().tolist() == want["translation"].numpy().tolist()
        assert got["score"].numpy() == pytest.approx(want["score"].numpy(), abs=1e-4)
    assert shortlists and all(shortlist is not None for shortlist in shortlists)


def test_warmup_texts_reach_each_shortlist_bucket_of_a_length(spm_model, shortlist_table):
    """The warm-up records of a shortlist export compile, per source-length bucket, every
    shortlist bucket that LONG_TEXT's words reach on the way to its length (both here);
    without a shortlist, one text per length bucket."""
    import sentencepiece as spm

    from tfxformer.decoding import shortlist_ids
    from tfxformer.serving.warmup import bucket_texts

    graph, compiled = _translators(spm_model, shortlist=shortlist_table)
    assert bucket_texts(graph) == []
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    reached = []
    for text in bucket_texts(compiled):
        pieces = processor.encode(text)[:15] + [3]  # the one length bucket, as truncated
        size = len(shortlist_ids([pieces], shortlist_table.table, shortlist_table.frequent))
        reached.append(min(b for b in compiled.compiled_search.shortlist_buckets if b >= size))
    assert sorted(reached) == [256, 320]
    _, plain = _translators(spm_model)
    assert len(bucket_texts(plain)) == len(plain.compiled_search.length_buckets) == 1


# The signatures that run the compiled search (the others decode as without it, and
# conftest's `tiny_export` exports them): the xla export holds these alone.
COMPILED_SIGNATURES = ["translate_with_options", "translate_per_example"]


@pytest.fixture(scope="module")
def xla_export(translators, tmp_path_factory):
    """(graph-path translator, compiled translator, version dir of the same weights
    exported with the compiled search of lone sentences, as `--xla-max-batch 1` exports;
    serving_default and COMPILED_SIGNATURES)."""
    from tfxformer.serving import export_translator

    graph, compiled = translators
    folder = tmp_path_factory.mktemp("xla_export")
    return graph, compiled, export_translator(compiled, str(folder / "tiny"),
                                              config={"src": "en", "tgt": "de"},
                                              signatures=COMPILED_SIGNATURES)


@pytest.mark.slow  # exports and loads a SavedModel
def test_export_records_it_and_loads(xla_export):
    from tensorflow.core.protobuf import saved_model_pb2

    from tfxformer.serving.warmup import read_warmup_records

    graph, compiled, version = xla_export
    with open(os.path.join(version, "assets", "config.json")) as f:
        assert json.load(f)["xla_max_batch"] == 1
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(version, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    compiled_functions = [f for f in saved.meta_graphs[0].graph_def.library.function
                          if f.attr["_XlaMustCompile"].b]
    assert len(compiled_functions) == 1  # one program source, shared by the signatures
    # A warm-up record per length bucket, one sentence each (XLA compiles them at load).
    lone = [log for log in read_warmup_records(version)
            if log.predict_log.request.model_spec.signature_name == "serving_default"
            and log.predict_log.request.inputs["text"].tensor_shape.dim[0].size == 1]
    assert len(lone) >= len(compiled.compiled_search.length_buckets) == 1
    loaded = tf.saved_model.load(version).signatures["serving_default"]
    for text in TEXTS:
        want = graph(tf.constant([text]))["translation"].numpy().tolist()
        assert loaded(text=tf.constant([text]))["translation"].numpy().tolist() == want


@pytest.mark.slow  # compiles and runs a C++ program
@pytest.mark.user_env
def test_cpp_loader_runs_the_compiled_search(program, xla_export, tmp_path):
    """TF Serving's load-and-run path (tests/cpp, test_serving_cpp.py's program) replays
    the lone-sentence warm-up records through the XLA-compiled search and answers as the
    graph path does, when started with --xla_cpu_compilation_enabled=true; without it (as
    tensorflow_model_server by default) the first request fails and says XLA is disabled
    (docs/serving.md names the flag)."""
    import subprocess

    from support.environment import user_env
    from support.serving_cpp import OP_LIBRARY

    from tfxformer.serving.warmup import read_warmup_records

    graph, _, version = xla_export
    # The lone-sentence records of serving_default (those the compiled search runs).
    requests = [log for log in read_warmup_records(version)
                if log.predict_log.request.model_spec.signature_name == "serving_default"]
    warmup = str(tmp_path / "requests.tfrecord")
    with tf.io.TFRecordWriter(warmup) as writer:
        for log in requests:
            writer.write(log.SerializeToString())
    output = str(tmp_path / "out.tfrecord")
    stock = subprocess.run([program, OP_LIBRARY, version, output, warmup], capture_output=True,
                           timeout=600, env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert stock.returncode != 0
    assert "XLA compilation disabled" in stock.stderr.decode(errors="replace")
    result = subprocess.run([program, "--xla_cpu_compilation_enabled=true", OP_LIBRARY, version,
                             output, warmup], capture_output=True, timeout=600,
                            env=user_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    records = [r.numpy() for r in tf.data.TFRecordDataset(output)]  # name, tensor, ...
    translations = []
    for i in range(0, len(records), 2):
        if records[i] == b"serving_default/translation":
            proto = tf.make_tensor_proto(0)
            proto.ParseFromString(records[i + 1])
            translations.append(tf.make_ndarray(proto))
    assert len(translations) == len(requests)
    for log, got in zip(requests, translations, strict=True):
        texts = tf.make_ndarray(log.predict_log.request.inputs["text"])
        assert got.tolist() == graph(tf.constant(texts))["translation"].numpy().tolist()


def test_export_precision_auto(monkeypatch):
    """`--precision auto`: bf16 where the exporting CPU has BF16 instructions, else fp32,
    with the reason config.json records."""
    from tfxformer import precision
    from tfxformer.serving import export

    for flags, want in (({"avx2", "avx512_bf16"}, "bf16"), ({"avx2", "amx_bf16"}, "bf16"),
                        ({"avx2", "avx512f"}, "fp32")):
        monkeypatch.setattr(precision, "this_machine",
                            lambda flags=flags: precision.Machine(frozenset(flags)))
        chosen, reason = export.export_precision("auto")
        assert chosen == want and reason.startswith("auto: CPU only")
    monkeypatch.setattr(precision, "this_machine", lambda: precision.Machine(None, ((7, 0),)))
    assert export.export_precision("auto")[0] == "fp32"  # a GPU's fp16: exports run fp32/bf16
    assert export.export_precision("bf16") == ("bf16", "given (`precision`)")
    with pytest.raises(ValueError, match="'fp16' not in"):
        export.export_precision("fp16")


def test_config_records_precision_reason_and_xla(spm_model):
    from tfxformer.serving.export import _asset_config

    _, compiled = _translators(spm_model)
    config = _asset_config(compiled, {"src": "en", "tgt": "de"}, "auto: CPU only, with amx_bf16")
    assert config["precision_reason"] == "auto: CPU only, with amx_bf16"
    assert config["xla_max_batch"] == 1
