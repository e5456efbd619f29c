"""One model for several target languages (tfxformer.multilingual): the tagged data folder,
the tags in the vocabulary, training on it, and the `target_language` input of the
Translator, its SavedModel export and load_translate_fn."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED_DATA

from tfxformer import Transformer, multilingual
from tfxformer.data.tokenizer import train_tokenizer

MULTI30K = os.path.join(SHARED_DATA, "multi30k")
LANGUAGES = ("de", "fr")
TEXTS = ["A dog runs in the park.", "", "Two men are talking.", "   "]


def _small_folder(root, lines=300):
    """The first `lines` Multi30k pairs of EN, DE and FR as train and val files."""
    folder = root / "multi30k"
    folder.mkdir()
    for lang in ("en", *LANGUAGES):
        with open(os.path.join(MULTI30K, f"train.{lang}"), encoding="utf-8") as f:
            text = [next(f) for _ in range(lines)]
        (folder / f"train.{lang}").write_text("".join(text), encoding="utf-8")
        (folder / f"val.{lang}").write_text("".join(text[:20]), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """A multilingual folder written from a small EN/DE/FR one."""
    root = tmp_path_factory.mktemp("multilingual")
    out = root / "tagged"
    counts = multilingual.write_folder(str(_small_folder(root)), str(out), "en", LANGUAGES)
    return out, counts


@pytest.fixture(scope="module")
def spm_model(tagged):
    """A vocabulary trained on the tagged folder, with the tags as pieces."""
    out, _ = tagged
    lines = [*(out / "train.en").read_text(encoding="utf-8").splitlines(),
             *(out / "train.mul").read_text(encoding="utf-8").splitlines()]
    tags = [multilingual.target_tag(language) for language in LANGUAGES]
    return train_tokenizer(lines, 400, user_defined_symbols=tags, num_threads=1).spm_bytes


@pytest.fixture(scope="module")
def model():
    tf.random.set_seed(5)
    model = Transformer.from_preset("tiny", vocab_size=400, max_positions=48)
    model.build()
    return model


def _strings(output):
    return [t.decode("utf-8") for t in output["translation"].numpy()]


def test_tags_and_languages():
    assert multilingual.target_tag("de") == "<2de>"
    assert multilingual.tag_source("fr", "A dog.") == "<2fr> A dog."
    assert multilingual.parse_languages("de, fr") == ("de", "fr")
    assert multilingual.parse_languages(["de", "fr"]) == ("de", "fr")
    assert multilingual.parse_languages(None) == ()
    for bad, message in (("de", "two or more"), ("de,de", "two or more"),
                         ("de,f r", "'f r' is not a language code"),
                         ("de,mul", "'mul' is not a language code")):
        with pytest.raises(ValueError, match=message):
            multilingual.parse_languages(bad)


def test_the_folder_holds_every_target_in_turn_with_its_tag(tagged):
    out, counts = tagged
    assert counts == {"train": 600, "val": 40}
    sources = (out / "train.en").read_text(encoding="utf-8").splitlines()
    targets = (out / "train.mul").read_text(encoding="utf-8").splitlines()
    with open(os.path.join(MULTI30K, "train.en"), encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    with open(os.path.join(MULTI30K, "train.fr"), encoding="utf-8") as f:
        french = f.readline().rstrip("\n")
    assert sources[0] == f"<2de> {first}" and sources[300] == f"<2fr> {first}"
    assert targets[300] == french and len(sources) == len(targets) == 600
    assert sorted(os.listdir(out)) == ["train.en", "train.mul", "val.en", "val.mul"]
    multilingual.check_tagged(sources, LANGUAGES, "train.en")


def test_the_folder_refuses_missing_and_misaligned_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for lang, lines in (("en", 3), ("de", 3), ("fr", 2)):
        (data / f"train.{lang}").write_text("x\n" * lines, encoding="utf-8")
    with pytest.raises(ValueError, match="train.fr has 2 lines"):
        multilingual.write_folder(str(data), str(tmp_path / "out"), "en", LANGUAGES,
                                  splits=["train"])
    with pytest.raises(FileNotFoundError, match="val.en"):
        multilingual.write_folder(str(data), str(tmp_path / "out"), "en", LANGUAGES,
                                  splits=["val"])
    assert not any(name.endswith(".part") for name in os.listdir(tmp_path / "out"))


def test_an_untagged_line_is_named():
    with pytest.raises(ValueError, match=r"Line 2 of train.en does not start with a target "
                                         r"tag \('<2de> ', '<2fr> '\): 'A cat.'"):
        multilingual.check_tagged(["<2de> A dog.", "A cat."], LANGUAGES, "train.en")


def test_the_tags_are_one_piece_each(spm_model):
    import sentencepiece as spm

    assert [multilingual.tag_pieces(spm_model, language) for language in LANGUAGES] == [2, 2]
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    assert processor.encode("<2fr> A dog", out_type=str)[:2] == ["▁", "<2fr>"]
    from support.serving import train_sentencepiece

    with pytest.raises(ValueError, match="does not hold the target tag '<2de>' as one piece"):
        multilingual.tag_pieces(train_sentencepiece(lines=200), "de")


def test_the_translator_adds_the_tag_that_training_saw(model, spm_model):
    """Asked for a language, the MultilingualTranslator translates exactly what a plain
    Translator makes of the tagged text (the training data's form); blank texts stay blank."""
    from tfxformer.serving import MultilingualTranslator, Translator, make_translator

    options = dict(beam_size=2, extra_length=3, max_batch_size=3)
    translator = make_translator(model, spm_model, LANGUAGES, **options)
    assert isinstance(translator, MultilingualTranslator)
    plain = Translator(model, spm_model, **options)
    languages = ["fr", "de", "de", "fr"]
    out = translator(tf.constant(TEXTS), tf.constant(languages))
    tagged = [multilingual.tag_source(lang, text) for lang, text in
              zip(languages, TEXTS, strict=True)]
    expected = plain(tf.constant(tagged))
    assert _strings(out)[0] == _strings(expected)[0] and _strings(out)[2] == _strings(expected)[2]
    np.testing.assert_allclose(out["score"].numpy()[[0, 2]], expected["score"].numpy()[[0, 2]],
                               atol=1e-5)
    assert _strings(out)[1] == _strings(out)[3] == "" and out["score"].numpy()[1] == 0.0
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"must be one of de, fr; got\] \[es it\]"):
        translator(tf.constant(TEXTS), tf.constant(["de", "es", "fr", "it"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one value per text"):
        translator(tf.constant(TEXTS), tf.constant(["de"]))
    with pytest.raises(ValueError, match=r"translates into 'de', 'fr': give `target_language`"):
        translator.translate(tf.constant(TEXTS))
    with pytest.raises(ValueError, match="`target_language` is for a multilingual model"):
        plain.translate(tf.constant(TEXTS), target_language=tf.constant(languages))


def test_scoring_and_sampling_read_the_tag_as_translation_does(model, spm_model):
    """A multilingual translator's `score` and `translate_sampled` give what a plain
    Translator gives for the tagged sources (the tag before the source, not the target)."""
    from tfxformer.serving import Translator, make_translator

    translator = make_translator(model, spm_model, LANGUAGES, max_batch_size=3)
    plain = Translator(model, spm_model, max_batch_size=3)
    languages, targets = ["fr", "de", "de", "fr"], ["Un chien.", "", "Ein Hund.", "x"]
    tagged = tf.constant([multilingual.tag_source(lang, text) for lang, text in
                          zip(languages, TEXTS, strict=True)])
    scored = translator.score(tf.constant(TEXTS), tf.constant(languages), tf.constant(targets))
    expected = plain.score(tagged, tf.constant(targets))
    for key in ("log_prob", "length", "truncated"):
        np.testing.assert_allclose(scored[key], expected[key], rtol=1e-5)
    seed = tf.constant(4, tf.int64)  # the non-blank texts: the same rows in both batches
    sampled = translator.translate_sampled(tf.constant(TEXTS[0::2]),
                                           tf.constant(languages[0::2]), 5, 1.0, 1.0, 3, seed)
    expected = plain.translate_sampled(tagged[0::2], 5, 1.0, 1.0, 3, seed)
    assert _strings(sampled) == _strings(expected)
    blank = translator.translate_sampled(tf.constant(TEXTS), tf.constant(languages), 5, 1.0,
                                         1.0, 3, seed)
    assert _strings(blank)[1::2] == ["", ""]  # blank besides the tag


def test_the_script_flag_is_checked():
    from tfxformer.training import TrainConfig

    config = TrainConfig(model_dir="x", data="d", target_languages="de")
    with pytest.raises(ValueError, match="`target_languages` 'de' must name two or more"):
        config.validate()
    assert TrainConfig(model_dir="x", target_languages="de,fr").languages() == LANGUAGES


def _config(data, model_dir, **overrides):
    from tfxformer.training import TrainConfig

    values = dict(model_dir=str(model_dir), data=str(data), src="en", tgt="mul",
                  target_languages="de,fr", preset="tiny", vocab_size=400, batch_tokens=1024,
                  max_length=48, train_steps=4, warmup_steps=2, checkpoint_every=4,
                  log_every=2, eval_every=0, eval_sentences=0, cpu_devices=1, average_last=0,
                  shuffle_buffer=1000, dropout=0.0)
    values.update(overrides)
    return TrainConfig(**values)


def test_training_refuses_untagged_sources(tmp_path):
    from tfxformer.training import train_and_evaluate

    data = _small_folder(tmp_path, lines=30)
    (data / "train.mul").write_bytes((data / "train.de").read_bytes())
    (data / "val.mul").write_bytes((data / "val.de").read_bytes())
    with pytest.raises(ValueError, match="Line 1 of the train sources .* does not start with "
                                         "a target tag"):
        train_and_evaluate(_config(data, tmp_path / "run"))
    assert not (tmp_path / "run" / "spm.model").exists()


@pytest.mark.slow
def test_train_export_serve_with_target_language(tagged, tmp_path,
                                                 load_each_saved_model_once):
    """A multilingual run → its vocabulary holds the tags → the export's signatures take
    `target_language` (warm-up records too) → load_translate_fn and evaluate.py translate
    into the language asked for, with errors for a missing or unknown one.

    The export holds all six signatures (the one test that each takes `target_language`);
    it is loaded once, and the loaders and evaluate.py share that load."""
    from support.serving import load_script

    from tfxformer.serving import (
        export_run_dir,
        load_translate_fn,
        target_languages_of,
    )
    from tfxformer.serving.warmup import read_warmup_records
    from tfxformer.training import train_and_evaluate

    out, _ = tagged
    run = tmp_path / "run"
    train_and_evaluate(_config(out, run))
    spm_bytes = (run / "spm.model").read_bytes()
    assert [multilingual.tag_pieces(spm_bytes, lang) for lang in LANGUAGES] == [2, 2]
    assert target_languages_of(str(run)) == LANGUAGES
    base = str(tmp_path / "export")
    version = export_run_dir(str(run), base, beam_size=2, extra_length=3)
    assert target_languages_of(base) == LANGUAGES
    loaded = tf.saved_model.load(version)
    for name in ("serving_default", "translate_with_options", "translate_per_example",
                 "translate_sampled", "translate_nbest", "score"):
        assert "target_language" in loaded.signatures[name].structured_input_signature[1]
    french = loaded.signatures["serving_default"](
        text=tf.constant(TEXTS), target_language=tf.constant(["fr"] * len(TEXTS)))
    in_run = load_translate_fn(str(run), beam_size=2, extra_length=3, target_language="fr")
    assert load_translate_fn(base, target_language="fr")(TEXTS) == _strings(french) \
        == in_run(TEXTS)
    with pytest.raises(ValueError, match=r"multilingual model: `target_language` must be one "
                                         r"of 'de', 'fr', got None"):
        load_translate_fn(base)
    with pytest.raises(ValueError, match="must be one of 'de', 'fr', got 'es'"):
        load_translate_fn(str(run), target_language="es")
    records = read_warmup_records(os.path.join(version, "assets.extra",
                                               "tf_serving_warmup_requests"))
    languages = {language for r in records for language in
                 tf.make_ndarray(r.predict_log.request.inputs["target_language"])}
    assert languages == {b"de", b"fr"}
    with open(os.path.join(version, "assets", "config.json"), encoding="utf-8") as f:
        assert json.load(f)["train"]["target_languages"] == "de,fr"
    # evaluate.py asks a multilingual model for --tgt.
    data = tmp_path / "eval"
    data.mkdir()
    (data / "val.en").write_text("".join(t + "\n" for t in TEXTS[:1]), encoding="utf-8")
    (data / "val.fr").write_text("Un chien court dans le parc.\n", encoding="utf-8")
    hyps = tmp_path / "hyps"
    assert load_script("evaluate").main(["--model", base, "--data", str(data), "--tgt", "fr",
                                         "--sets", "val", "--hyp-dir", str(hyps)]) == 0
    assert (hyps / "val.beam.fr").read_text(encoding="utf-8") == _strings(french)[0] + "\n"
