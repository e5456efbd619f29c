"""tfxformer.decoding.shortlist: the table, the per-batch shortlist, the searches over it,
and the translator / export that carry it."""

import doctest
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from support.environment import user_env
from support.serving import FRESH_PROCESS, load_script
from support.steering import cleaned

from tfxformer import Transformer
from tfxformer.decoding import (
    EOS_ID,
    PAD_ID,
    DecodeStart,
    beam_search,
    build_shortlist_table,
    greedy_decode,
    greedy_search,
    sequence_beam_search,
    shortlist_ids,
    transformer_decoder,
)
from tfxformer.decoding import shortlist as shortlist_module
from tfxformer.decoding.common import NEG_INF
from tfxformer.pretrained import load_saved_model_weights
from tfxformer.serving import Translator, export_translator

VOCAB = 40
SOURCE = tf.constant([[5, 6, 7, 8, 9, 3], [10, 11, 3, 0, 0, 0], [12, 3, 0, 0, 0, 0]])
PARTIAL = [0, 1, 2, 3, 5, 8, 13, 17, 21, 22, 30, 39]


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(7)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    model.build()
    return model


# --- the table -------------------------------------------------------------------------

# Sources 4..7, targets 8..11, EOS (3) at some ends (special ids are not counted).
# c(s): 4: 2, 5: 2, 6: 1; c(t): 8: 2, 9: 4, 10: 1, 11: 1; occurrences: 9: 4, 8: 2, 11: 2.
CORPUS = [([4, 5, 3], [8, 9, 3]), ([4], [8, 9]), ([5, 5], [9, 10]), ([6], [9, 11, 11])]


def test_table_ranks_targets_by_dice_then_count_then_id():
    table = build_shortlist_table(CORPUS, 12, per_source=2, frequent=2)
    rows = table.table.tolist()
    # Dice(4, 8) = 2*2/(2+2) = 1 > Dice(4, 9) = 4/6
    assert rows[4] == [8, 9]
    # Dice(5, 9) = 4/6 = Dice(5, 10) = 2/3: the higher count c(5, 9) = 2 first
    assert rows[5] == [9, 10]
    # Dice(6, 11) = 2/2 beats Dice(6, 9) = 2/5 (p(t | s) would tie them, 9 first by id);
    # 11 twice in its target counts once
    assert rows[6] == [11, 9]
    assert rows[7] == [0, 0] and rows[3] == [0, 0]  # unseen source, special id: PAD
    # by occurrences: 9 (4), then 8 and 11 (2 each) by id
    assert table.frequent.tolist() == [9, 8]
    assert table.table.dtype == np.int32 and table.frequent.dtype == np.int32
    assert table.info == {"score": "dice", "per_source": 2, "frequent": 2, "pairs": 4,
                          "vocab_size": 12}


def test_table_from_arrays_equals_lists_and_keeps_fewer_frequent_ids_than_asked():
    arrays = [(np.array(s, np.int64), np.array(t, np.int16)) for s, t in CORPUS]
    by_arrays = build_shortlist_table(arrays, 12, per_source=3, frequent=12)
    by_lists = build_shortlist_table(CORPUS, 12, per_source=3, frequent=12)
    np.testing.assert_array_equal(by_arrays.table, by_lists.table)
    assert by_arrays.frequent.tolist() == [9, 8, 11, 10]  # only 4 target tokens seen
    assert by_arrays.table[4].tolist() == [8, 9, 0]


def test_table_merges_counts_across_flushes(monkeypatch):
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(4, 30, 6), rng.integers(4, 30, 7)) for _ in range(300)]
    whole = build_shortlist_table(pairs, 30, per_source=5, frequent=7)
    monkeypatch.setattr(shortlist_module, "_FLUSH_KEYS", 50)  # a merge every pair or so
    merged = build_shortlist_table(pairs, 30, per_source=5, frequent=7)
    np.testing.assert_array_equal(whole.table, merged.table)
    np.testing.assert_array_equal(whole.frequent, merged.frequent)


@pytest.mark.parametrize("kwargs, message", [
    (dict(per_source=0), "per_source.*0"), (dict(per_source=13), "per_source.*13"),
    (dict(per_source=1.5), "per_source.*1.5"), (dict(per_source=True), "per_source"),
    (dict(frequent=-1), "frequent.*-1"), (dict(frequent=13), "frequent.*13"),
    (dict(vocab_size=4), "vocab_size.*4"),
])
def test_bad_table_sizes_are_named(kwargs, message):
    kwargs = {"vocab_size": 12, "per_source": 2, "frequent": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        build_shortlist_table(CORPUS, **kwargs)


@pytest.mark.parametrize("pairs, message", [
    ([([4], [8]), ([4], [12])], r"pairs\[1\]\[1\].*12.*\[0, 12\)"),
    ([([-1], [8])], r"pairs\[0\]\[0\].*-1"),
    ([([4.0], [8])], r"pairs\[0\]\[0\].*float"),
    ([([[4]], [8])], r"pairs\[0\]\[0\].*1-D"),
    ([([4], [8], [9])], r"pairs\[0\] must be \(source ids, target ids\)"),
    ([5], r"pairs\[0\] must be"),
])
def test_bad_pairs_are_named(pairs, message):
    with pytest.raises(ValueError, match=message):
        build_shortlist_table(pairs, 12, per_source=2, frequent=2)


def test_table_against_another_vocabulary_is_refused(model):
    table = build_shortlist_table(CORPUS, 12, per_source=2, frequent=2)
    with pytest.raises(ValueError, match="12 rows.*40"):
        shortlist_module.check_table(table, VOCAB)
    with pytest.raises(ValueError, match="ShortlistTable"):
        shortlist_module.check_table(7, VOCAB)
    bad = table._replace(frequent=np.array([3, 50]))
    with pytest.raises(ValueError, match="frequent ids.*outside"):
        shortlist_module.check_table(bad, 12)


def test_module_docstring_examples_run():
    result = doctest.testmod(shortlist_module)
    assert result.attempted >= 2 and result.failed == 0


# --- the per-batch shortlist -----------------------------------------------------------

def test_shortlist_ids_is_the_sorted_union_with_the_specials():
    table = np.zeros([VOCAB, 2], np.int32)
    table[5], table[6], table[10], table[0] = [20, 7], [7, 0], [33, 34], [38, 39]
    ids = shortlist_ids(tf.constant([[5, 6, 3], [10, 0, 0]]), table, [11, 20])
    # row 0 (PAD) is not read, 0..3 always in, duplicates once, sorted
    assert ids.numpy().tolist() == [0, 1, 2, 3, 7, 11, 20, 33, 34]
    assert ids.dtype == tf.int32
    traced = tf.function(lambda s: shortlist_ids(s, tf.constant(table)))
    assert traced(tf.constant([[6, 0]])).numpy().tolist() == [0, 1, 2, 3, 7]


# --- the searches over a shortlist -----------------------------------------------------

@pytest.mark.parametrize("static_cache", [False, True])
def test_a_shortlist_of_the_whole_vocabulary_changes_nothing(model, static_cache):
    everything = shortlist_ids(SOURCE, np.tile(np.arange(VOCAB), [VOCAB, 1]))
    assert everything.numpy().tolist() == list(range(VOCAB))
    for decode, kwargs in ((beam_search, dict(beam_size=3)), (greedy_decode, {})):
        full = decode(model, SOURCE, extra_length=3, static_cache=static_cache, **kwargs)
        listed = decode(model, SOURCE, extra_length=3, static_cache=static_cache,
                        shortlist=everything, **kwargs)
        for a, b in zip(full, listed, strict=True):
            if a is not None:  # token_log_probs, not asked for
                np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_whole_vocabulary_shortlist_changes_nothing_in_bfloat16():
    tf.random.set_seed(7)
    from tfxformer.config import get_preset

    model = Transformer(get_preset("tiny", vocab_size=VOCAB), dtype="mixed_bfloat16")
    assert model.compute_dtype == "bfloat16"
    full = beam_search(model, SOURCE, beam_size=2, extra_length=4)
    listed = beam_search(model, SOURCE, beam_size=2, extra_length=4, shortlist=range(VOCAB))
    for a, b in zip(full, listed, strict=True):
        if a is not None:  # token_log_probs, not asked for
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def _masked_start(model, source, beams, allowed):
    """The full-vocabulary step function with every logit outside `allowed` at NEG_INF."""
    start = transformer_decoder(model, source, beams, extra_length=6)
    outside = ~np.isin(np.arange(VOCAB), allowed)

    def step_fn(ids, index, cache, context):
        logits, cache = start.step_fn(ids, index, cache, context)
        return tf.where(outside, NEG_INF, logits[:, -1]), cache

    return DecodeStart(step_fn, start.cache, start.context, start.limits, start.output_columns)


def test_a_partial_shortlist_is_the_full_search_restricted_to_it(model):
    beam = beam_search(model, SOURCE, beam_size=3, extra_length=6, shortlist=PARTIAL)
    masked = sequence_beam_search(_masked_start(model, SOURCE, 3, PARTIAL), beam_size=3)
    np.testing.assert_array_equal(beam.ids.numpy(), masked.ids.numpy())
    np.testing.assert_allclose(beam.scores.numpy(), masked.scores.numpy(), rtol=1e-5)
    greedy = greedy_decode(model, SOURCE, extra_length=6, shortlist=PARTIAL)
    masked = greedy_search(_masked_start(model, SOURCE, 1, PARTIAL))
    np.testing.assert_array_equal(greedy.ids.numpy(), masked.ids.numpy())
    for out in (beam, greedy):
        assert set(out.ids.numpy().ravel()) <= set(PARTIAL)
        assert set(out.ids.numpy().ravel()) - {PAD_ID, EOS_ID}  # not only specials
    full = beam_search(model, SOURCE, beam_size=3, extra_length=6)
    assert set(full.ids.numpy().ravel()) - set(PARTIAL)  # so the shortlist mattered


def test_shortlist_search_in_a_graph_with_the_batch_shortlist(model):
    table = np.tile(np.array(PARTIAL[4:8]), [VOCAB, 1])

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def translate(source):
        return beam_search(model, source, beam_size=2, extra_length=3,
                           shortlist=shortlist_ids(source, table, [30])).ids

    ids = translate(SOURCE).numpy()
    assert set(ids.ravel()) <= {0, 1, 2, 3, 5, 8, 13, 17, 30}
    eager = beam_search(model, SOURCE, beam_size=2, extra_length=3,
                        shortlist=[0, 1, 2, 3, 5, 8, 13, 17, 30])
    np.testing.assert_array_equal(ids, eager.ids.numpy())


@pytest.mark.parametrize("shortlist, message", [
    ([0, 1, 2, 5], "starting with the special ids"), ([0, 1, 2, 3, 9, 7], "sorted unique"),
    ([0, 1, 2, 3, 3], "sorted unique"), ([0, 1, 2, 3, VOCAB], r"\[0, 40\)"),
    ([[0, 1, 2, 3]], "1-D"), ([0.0, 1.0, 2.0, 3.0], "integer"),
])
def test_bad_shortlists_are_named(model, shortlist, message):
    with pytest.raises(ValueError, match=message):
        beam_search(model, SOURCE, shortlist=shortlist)


def test_bad_shortlist_tensor_in_a_graph_fails_its_assertion(model):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def decode(shortlist):
        return greedy_decode(model, SOURCE, extra_length=2, shortlist=shortlist).ids

    assert decode(tf.constant(PARTIAL)).shape[0] == 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted unique ids"):
        decode(tf.constant([0, 1, 2, 3, 9, 7]))


def test_a_shortlist_needs_a_special_eos(model):
    with pytest.raises(ValueError, match="eos_id.*special id.*7"):
        beam_search(model, SOURCE, shortlist=PARTIAL, eos_id=7)
    lengths = greedy_decode(model, SOURCE, extra_length=2, shortlist=PARTIAL, eos_id=None)
    assert lengths.lengths.numpy().tolist() == [8, 5, 4]  # source length + 2: no EOS ends


# --- the translator and its export ----------------------------------------------------

@pytest.fixture(scope="module")
def translators(spm_model, spm_table):
    tf.random.set_seed(3)
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=48)
    options = dict(beam_size=3, extra_length=4, max_batch_size=3)
    return (Translator(model, spm_model, **options),
            Translator(model, spm_model, shortlist=spm_table, **options))


TEXTS = ["A dog runs in the park.", "", "Two men are playing football on the grass.",
         "A woman in a red coat.", "Children play.", "A man rides a bike down the street."]


@pytest.mark.slow
def test_translator_decodes_each_chunk_over_its_shortlist(translators, spm_model, spm_table):
    full, listed = translators
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    out = listed(tf.constant(TEXTS))
    strings = out["translation"].numpy().tolist()
    assert strings != full(tf.constant(TEXTS))["translation"].numpy().tolist()
    assert strings[1] == b""
    # chunks of 3 in length order: the longest three, then the others but the blank one
    order = sorted(range(len(TEXTS)), key=lambda i: -len(processor.encode(TEXTS[i])))
    order.remove(1)
    for chunk in (order[:3], order[3:]):
        source = tf.ragged.constant([processor.encode(TEXTS[i]) + [EOS_ID]
                                     for i in chunk]).to_tensor()
        shortlist = shortlist_ids(source, spm_table.table, spm_table.frequent)
        assert 4 < len(shortlist) < 320
        best = beam_search(listed.model, source, beam_size=3, extra_length=4,
                           shortlist=shortlist)
        assert set(best.ids.numpy().ravel()) <= set(shortlist.numpy())
        text = listed.detokenize(best.ids[:, 0], best.lengths[:, 0]).numpy().tolist()
        assert [strings[i] for i in chunk] == [cleaned(t.decode()).encode() for t in text]
        np.testing.assert_allclose(out["score"].numpy()[chunk], best.scores[:, 0], rtol=1e-5)


@pytest.mark.slow
def test_translator_with_a_whole_vocabulary_table_changes_nothing(translators, spm_model):
    full, _ = translators
    table = build_shortlist_table([(np.arange(4, 320), np.arange(4, 320))], 320,
                                  per_source=316, frequent=0)
    whole = Translator(full.model, spm_model, beam_size=3, extra_length=4, max_batch_size=3,
                       shortlist=table)
    a, b = full(tf.constant(TEXTS)), whole(tf.constant(TEXTS))
    assert a["translation"].numpy().tolist() == b["translation"].numpy().tolist()
    np.testing.assert_array_equal(a["score"].numpy(), b["score"].numpy())


def test_translator_refuses_a_table_of_another_vocabulary(spm_model):
    model = Transformer.from_preset("tiny", vocab_size=320)
    with pytest.raises(ValueError, match="12 rows.*320"):
        Translator(model, spm_model, shortlist=build_shortlist_table(CORPUS, 12, 2, 2))


@pytest.fixture(scope="module")
def shortlist_export(translators, tmp_path_factory):
    base = tmp_path_factory.mktemp("saved_models") / "shortlist"
    return export_translator(translators[1], str(base), config={"src": "en", "tgt": "de"})


@pytest.mark.slow
def test_export_holds_the_table_apart_from_the_model_variables(shortlist_export, translators,
                                                              spm_table):
    loaded = tf.saved_model.load(shortlist_export)
    np.testing.assert_array_equal(loaded.shortlist_table.numpy(), spm_table.table)
    np.testing.assert_array_equal(loaded.shortlist_frequent.numpy(), spm_table.frequent)
    assert len(loaded.model_variables) == len(translators[1].model.weights)
    with open(os.path.join(shortlist_export, "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["precision"] == "fp32"
    assert config["shortlist"] == {**spm_table.info, "table_shape": [320, 3],
                                   "frequent_ids": 10}
    # the weights re-load for a re-export (the table is not a model variable)
    model, _, _ = load_saved_model_weights(Transformer, shortlist_export)
    np.testing.assert_array_equal(model.weights[0].numpy(),
                                  translators[1].model.weights[0].numpy())


@pytest.mark.slow
@pytest.mark.user_env
def test_exported_shortlist_runs_in_a_fresh_tensorflow_process(shortlist_export, translators):
    """Only core and tensorflow-text ops; the session loader (as TF Serving) gives the
    in-process strings."""
    texts = [t.encode() for t in TEXTS]
    import base64

    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, shortlist_export, "translation"], capture_output=True,
        timeout=240, env=user_env(TF_CPP_MIN_LOG_LEVEL="3"),
        input=json.dumps([base64.b64encode(t).decode() for t in texts]).encode())
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    fresh = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert fresh["unknown"] == [] and not fresh["tfxformer_loaded"]
    expected = [t.decode() for t in translators[1](tf.constant(texts))["translation"].numpy()]
    assert fresh["translation"] == expected and fresh["session"] == expected


# --- scripts/export.py ------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir_with_data(spm_model, tmp_path_factory):
    """A run dir whose config names a tiny training folder (train/val, en/de)."""
    from support.serving import DATA

    root = tmp_path_factory.mktemp("shortlist_run")
    data = root / "data"
    data.mkdir()
    for split, lines in (("train", 300), ("val", 5)):
        for lang in ("en", "de"):
            with open(os.path.join(DATA, "multi30k", f"train.{lang}"), encoding="utf-8") as f:
                (data / f"{split}.{lang}").write_text("".join(next(f) for _ in range(lines)))
    run = root / "run"
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=40)
    model.build()
    checkpoint = tf.train.Checkpoint(model=model)
    tf.train.CheckpointManager(checkpoint, str(run / "checkpoints"), max_to_keep=1,
                               checkpoint_name="ckpt").save(checkpoint_number=1)
    (run / "spm.model").write_bytes(spm_model)
    (run / "config.json").write_text(json.dumps(
        {"model": model.model_config.to_dict(), "src": "en", "tgt": "de", "max_length": 40,
         "train": {"data": str(data)}}))
    return str(run), str(data)


@pytest.mark.slow
def test_export_script_bf16_shortlist_then_re_export(run_dir_with_data, tmp_path):
    """A run dir exported in bf16 computes in bfloat16 and carries the shortlist built from
    its training data; its re-export takes the table from --shortlist-data, in fp32.

    The bf16 export holds all six signatures (the suite's bf16 export of every one); the
    re-export, read for its table and record only, holds serving_default alone."""
    run, data = run_dir_with_data
    main = load_script("export").main
    base = str(tmp_path / "export")
    assert main(["--model", run, "--export-dir", base, "--shortlist", "4,20",
                 "--shortlist-max-pairs", "100", "--precision", "bf16"]) == 0
    with open(os.path.join(base, "1", "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["precision"] == "bf16" and config["compute_dtype"] == "bfloat16"
    out = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"](
        text=tf.constant(["A dog runs.", "Two men."]))
    assert out["translation"].shape == (2,)
    assert config["shortlist"]["data"] == data and config["shortlist"]["table_shape"] == [320, 4]
    assert (config["shortlist"]["pairs"], config["shortlist"]["max_pairs"]) == (100, 100)
    # re-export of that SavedModel, the table from --shortlist-data (all 300 pairs)
    assert main(["--model", os.path.join(base, "1"), "--export-dir", base, "--shortlist",
                 "2,5", "--shortlist-data", data, "--signatures", "serving_default"]) == 0
    loaded = tf.saved_model.load(os.path.join(base, "2"))
    assert loaded.shortlist_table.shape == (320, 2)
    with open(os.path.join(base, "2", "assets", "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert (config["precision"], config["shortlist"]["pairs"]) == ("fp32", 300)


def test_asset_config_never_keeps_a_stale_shortlist_record(translators):
    from tfxformer.serving.export import _asset_config

    stale = {"shortlist": {"per_source": 99}, "precision": "bf16"}
    config = _asset_config(translators[0], stale)
    assert (config["shortlist"], config["precision"]) == (None, "fp32")
    assert _asset_config(translators[1], stale)["shortlist"]["per_source"] == 3


@pytest.mark.parametrize("flags, message", [
    (["--shortlist", "5"], "expected K,N"), (["--shortlist", "0,3"], "K must be >= 1"),
    (["--shortlist", "a,b"], "expected K,N"),
    (["--shortlist-data", "/nowhere"], "need --shortlist"),
    (["--shortlist", "2,3", "--shortlist-data", "/nowhere"], "/nowhere"),
    (["--shortlist", "2,3", "--shortlist-max-pairs", "0"], "max-pairs must be >= 1"),
])
def test_export_script_shortlist_errors(run_dir_with_data, tmp_path, capsys, flags, message):
    main = load_script("export").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", run_dir_with_data[0], "--export-dir", str(tmp_path / "x"), *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x" / "1")


# --- bench/decode_speed.py's stand-in --------------------------------------------------

def test_bench_best_is_an_alias_and_its_stand_in_table_gives_l_ids():
    import importlib

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    try:
        bench = importlib.import_module("decode_speed")
    finally:
        sys.path.pop(0)
    best = bench.parse_args(["--best"])
    explicit = bench.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in bench.BEST.items()])
    assert (best.precision, best.shortlist_size) == (explicit.precision,
                                                     explicit.shortlist_size)
    args = bench.parse_args(["--vocab-size", "1000", "--shortlist-size", "300"])
    source = bench.source_ids(64, 24, 1000)
    ids = shortlist_ids(source, bench.stand_in_table(args))
    assert ids.shape == (300,) and ids.numpy()[:4].tolist() == [0, 1, 2, 3]
    with pytest.raises(SystemExit):
        bench.parse_args(["--vocab-size", "1000", "--shortlist-size", "3"])
