"""The `score` and `translate_sampled` signatures of a translator (tfxformer.serving.scoring,
.sampling, .signatures): in process, from a run dir and a SavedModel, and through
scripts/score.py and scripts/translate.py."""

import json
import os

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import tiny_export_translator
from support.serving import ROBUST_INPUTS, load_script, run_script
from support.steering import cleaned

from tfxformer import Transformer
from tfxformer.decoding import BOS_ID, EOS_ID, greedy_decode
from tfxformer.decoding.sampling import fold_seed, seed_key
from tfxformer.serving import load_sample_fn, load_score_fn
from tfxformer.serving.sampling import SampleFn, call_seed
from tfxformer.serving.signatures import OpenedSignature

SOURCES = ["A dog runs in the park.", "Two men are talking.", "A woman sings.", ""]
TARGETS = ["Ein Hund rennt im Park.", "Zwei Männer reden.", "", "Ein Hund."]


@pytest.fixture(scope="module")
def translator(tiny_export, spm_model):
    """conftest's tiny export in process: beam 3, extra length 4, chunks of 3, 48 positions."""
    return tiny_export_translator(tiny_export, spm_model)


@pytest.fixture(scope="module")
def processor(spm_model):
    return spm.SentencePieceProcessor(model_proto=spm_model)


def _keras_score(model, source_ids, target_ids):
    """Per-token log-probabilities of `target_ids` by the Keras model's call, in numpy."""
    inputs = tf.constant([[BOS_ID] + target_ids[:-1]])
    logits = model((tf.constant([source_ids]), inputs)).numpy()[0].astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return log_probs[np.arange(len(target_ids)), target_ids]


def test_score_signature_gives_the_keras_models_teacher_forced_log_probs(translator,
                                                                         processor):
    out = {k: v.numpy() for k, v in translator.score(tf.constant(SOURCES),
                                                     tf.constant(TARGETS)).items()}
    assert out["token_log_probs"].shape == (4, max(out["length"]))
    for i, (source, target) in enumerate(zip(SOURCES, TARGETS, strict=True)):
        ids = processor.encode(target) + [EOS_ID]  # a blank side is EOS alone, and scored
        expected = _keras_score(translator.model, processor.encode(source) + [EOS_ID], ids)
        assert out["length"][i] == len(ids) and not out["truncated"][i]
        np.testing.assert_allclose(out["token_log_probs"][i, :len(ids)], expected, rtol=1e-4)
        assert np.all(out["token_log_probs"][i, len(ids):] == 0.0)
        np.testing.assert_allclose(out["log_prob"][i], expected.sum(), rtol=1e-5)
        np.testing.assert_allclose(out["mean_log_prob"][i], expected.sum() / len(ids),
                                   rtol=1e-5)


def test_score_takes_any_input_as_translate_does(translator):
    """Invalid UTF-8 reads as U+FFFD, over-long sides are cut and flagged (a target to
    `max_output_tokens` tokens, its EOS cut too), an empty batch gives empty outputs."""
    texts = tf.constant(ROBUST_INPUTS)
    out = translator.score(texts, tf.constant(ROBUST_INPUTS[::-1]))
    n, limit = len(ROBUST_INPUTS), translator.max_output_tokens
    assert all(out[k].shape == (n,) for k in ("log_prob", "mean_log_prob", "length"))
    assert np.all(np.isfinite(out["token_log_probs"].numpy()))
    huge = [i for i, t in enumerate(ROBUST_INPUTS) if len(t) > 10_000]
    assert out["truncated"].numpy()[huge + [n - 1 - i for i in huge]].all()
    assert [out["length"].numpy()[n - 1 - i] for i in huge] == [limit] * len(huge)
    assert out["length"].numpy().max() == limit
    assert not out["truncated"].numpy()[[2, 3]].any()  # blank sources, short targets
    bad = translator.score(tf.constant([b"\xff\xfe dog", b"A dog."]),
                           tf.constant([b"Ein Hund.", b"\xc3 Hund"]))
    fixed = translator.score(tf.constant(["\ufffd\ufffd dog", "A dog."]),
                             tf.constant(["Ein Hund.", "\ufffd Hund"]))
    np.testing.assert_allclose(bad["log_prob"], fixed["log_prob"], rtol=1e-6)
    empty = translator.score(tf.constant([], tf.string), tf.constant([], tf.string))
    assert empty["log_prob"].shape == (0,) and empty["token_log_probs"].shape == (0, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`target` must have one value"):
        translator.score(tf.constant(["A dog."]), tf.constant(["a", "b"]))


def test_sampled_signature_draws_what_greedy_decode_draws(translator, processor):
    """Chunk 0 of the translator samples with the key fold_in(seed, 0); blank texts stay
    blank; the same seed gives the same translations, another seed others."""
    text, seed = "A dog runs in the park.", tf.constant(7, tf.int64)
    out = translator.translate_sampled(tf.constant([text, ""]), 5, 0.8, 0.9, 4, seed)
    key = fold_seed(seed_key(seed), 0)
    best = greedy_decode(translator.model, [processor.encode(text) + [EOS_ID]],
                         extra_length=4, max_output_length=translator.max_output_tokens,
                         sampling_topk=5, sampling_temperature=0.8, sampling_topp=0.9,
                         seed=key)
    expected = translator.detokenize(best.ids, best.lengths).numpy().tolist()
    # an output holds no C0 control nor a "⁇" its source had not (serving/reading.py)
    assert out["translation"].numpy().tolist() == [
        cleaned(t.decode()).encode() for t in expected] + [b""]
    np.testing.assert_allclose(out["score"].numpy(), [best.scores[0], 0.0], rtol=1e-5)
    texts = tf.constant(SOURCES * 2)  # 6 texts: two chunks of 3
    first = translator.translate_sampled(texts, 0, 1.0, 1.0, 4, seed)["translation"]
    again = translator.translate_sampled(texts, 0, 1.0, 1.0, 4, seed)["translation"]
    other = translator.translate_sampled(texts, 0, 1.0, 1.0, 4, seed + 1)["translation"]
    assert first.numpy().tolist() == again.numpy().tolist() != other.numpy().tolist()
    greedy = translator.translate_sampled(texts, 1, 1.0, 1.0, 4, seed)["translation"]
    assert greedy.numpy().tolist() == translator.translate_with_options(
        texts, 1, 0.0, 4)["translation"].numpy().tolist()
    with pytest.raises(tf.errors.InvalidArgumentError, match="`sampling_temperature` must"):
        translator.translate_sampled(texts, 5, 0.0, 1.0, 4, seed)


@pytest.fixture(scope="module")
def run_dir(spm_model, tmp_path_factory):
    """A run dir of an untrained tiny model (config.json, spm.model, one checkpoint)."""
    path = tmp_path_factory.mktemp("run")
    model = Transformer.from_preset("tiny", vocab_size=320, max_positions=40)
    model.build()
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(path / "checkpoints"),
                               max_to_keep=1, checkpoint_name="ckpt").save(checkpoint_number=1)
    (path / "spm.model").write_bytes(spm_model)
    (path / "config.json").write_text(json.dumps(
        {"model": model.model_config.to_dict(), "src": "en", "tgt": "de", "max_length": 40}))
    return str(path), model


def test_python_functions_on_a_run_dir_score_and_sample_with_its_model(run_dir, processor):
    path, model = run_dir
    score = load_score_fn(path, batch_size=2)
    for got, source, target in zip(score(SOURCES, TARGETS), SOURCES, TARGETS, strict=True):
        expected = _keras_score(model, processor.encode(source) + [EOS_ID],
                                processor.encode(target) + [EOS_ID])
        np.testing.assert_allclose(got.token_log_probs, expected, rtol=1e-4)
        assert got.log_prob == pytest.approx(expected.sum(), rel=1e-5)
        assert got.mean_log_prob == pytest.approx(expected.mean(), rel=1e-5)
    with pytest.raises(ValueError, match="One target per source: got 4 sources and 1"):
        score(SOURCES, TARGETS[:1])
    sample = load_sample_fn(path, 5, seed=3, extra_length=4, batch_size=2)
    assert sample.describe().endswith("top-k 5, temperature 1.0, top-p 1.0, extra length 4, "
                                      "seed 3")
    lines = sample(SOURCES)
    assert len(lines) == 4 and lines[3] == ""  # a blank line stays blank
    for bad, message in ((dict(seed=None), "needs a `seed`"), (dict(seed=-1), "`seed` must"),
                         (dict(seed=1, sampling_temperature=0.0), "sampling_temperature")):
        with pytest.raises(ValueError, match=message):
            load_sample_fn(path, 5, **bad)
    with pytest.raises(ValueError, match="`target_language` 'de' is for a multilingual"):
        load_score_fn(path, target_language="de")


def test_an_export_without_the_signatures_asks_for_a_re_export(tmp_path, capsys):
    """An export made before `score` and `translate_sampled` existed (as the shipped ones):
    the Python functions and both scripts name the command that re-exports it."""
    old = tf.Module()
    old.f = tf.function(lambda text: {"translation": text},
                        input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    tf.saved_model.save(old, str(tmp_path / "old" / "1"),
                        signatures={"serving_default": old.f.get_concrete_function()})
    assets = tmp_path / "old" / "1" / "assets"  # an export of this package has its record
    assets.mkdir(exist_ok=True)
    (assets / "config.json").write_text(json.dumps({"model": {"vocab_size": 8}}))
    (assets / "spm.model").write_bytes(b"")
    for load, args in ((load_score_fn, ()), (load_sample_fn, (5,))):
        with pytest.raises(ValueError, match=r"Re-export it with scripts/export.py to get the "
                                             r"`(score|translate_sampled)` signature"):
            load(str(tmp_path / "old"), *args, **({"seed": 1} if args else {}))
    (tmp_path / "a.txt").write_text("A dog.\n")
    for script, argv in (("score", ["--src", str(tmp_path / "a.txt"),
                                    "--tgt", str(tmp_path / "a.txt")]),
                         ("translate", ["--sampling-topk", "5", "--seed", "1"])):
        with pytest.raises(SystemExit) as exit_:
            load_script(script).main(["--model", str(tmp_path / "old"), *argv])
        assert exit_.value.code == 2
        assert "scripts/export.py --model" in capsys.readouterr().err


def test_script_flags_that_do_not_go_together_are_named(tmp_path, capsys):
    translate, score = load_script("translate"), load_script("score")
    for argv, message in ((["--sampling-topk", "5", "--beam-size", "4"], "--beam-size must be 1"),
                          (["--sampling-topk", "5", "--alpha", "0.6"], "--alpha is beam"),
                          (["--seed", "3"], "--seed need --sampling-topk"),
                          (["--sampling-topk", "5", "--sampling-topp", "0"], "must be in (0.0")):
        with pytest.raises(SystemExit):
            translate.parse_args(["--model", "m", *argv])
        assert message in capsys.readouterr().err, argv
    (tmp_path / "a").write_text("1\n2\n")
    (tmp_path / "b").write_text("1\n")
    with pytest.raises(SystemExit):
        score.main(["--model", "m", "--src", str(tmp_path / "a"), "--tgt", str(tmp_path / "b")])
    assert "--src has 2 lines and --tgt 1" in capsys.readouterr().err


@pytest.mark.slow
def test_score_script_end_to_end(tiny_export, translator, tmp_path):
    """scripts/score.py on the export: one line per pair, the in-process scores."""
    sources = [s.encode() for s in SOURCES] + [b"\xff\xfe bad bytes"]
    targets = [t.encode() for t in TARGETS] + [b"x"]
    (tmp_path / "src").write_bytes(b"".join(s + b"\n" for s in sources))
    (tmp_path / "tgt").write_bytes(b"".join(t + b"\n" for t in targets))
    stdout = run_script("score", ["--model", os.path.dirname(tiny_export), "--src",
                                  str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt"),
                                  "--tokens", "--batch-size", "2"])
    rows = [line.split("\t") for line in stdout.splitlines()]
    out = translator.score(tf.constant(sources), tf.constant(targets))
    assert len(rows) == len(sources)
    np.testing.assert_allclose([float(r[0]) for r in rows], out["log_prob"], atol=1e-3)
    np.testing.assert_allclose([float(r[1]) for r in rows], out["mean_log_prob"], atol=1e-3)
    assert [len(r[2].split()) for r in rows] == out["length"].numpy().tolist()


@pytest.mark.slow
def test_translate_script_samples_end_to_end(tiny_export, translator):
    """translate.py --sampling-topk on the export equals the same SampleFn run here."""
    lines = [b"A dog runs.", b"", b"\xff\xfe bad bytes", b"Two men.", b"A cat sleeps."] * 2
    stdout = run_script("translate", ["--model", os.path.dirname(tiny_export), "--batch-size",
                                      "4", "--sampling-topk", "5", "--sampling-temperature",
                                      "1.2", "--seed", "11"], stdin=b"\n".join(lines) + b"\n")
    here = SampleFn(OpenedSignature(translator.translate_sampled, translator, "here", "model",
                                    (), translator.options),
                    translator.options.replace(beam_size=1, sampling_topk=5,
                                               sampling_temperature=1.2), 11, batch_size=4)
    expected = load_script("translate").translate_stream(here, lines, 4)
    assert stdout.split("\n")[:-1] == [t.replace("\r", " ").replace("\n", " ")
                                       for t in expected]
    assert call_seed(11, 0) != call_seed(11, 1)  # each batch draws afresh
