"""tfxformer.serving.reading: how every signature reads a text as sentence rows and writes
their outputs back; hostile input through an export's signatures never crashes."""

import json
import os

import pytest
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS

from tfxformer.serving.reading import (
    RAW,
    ReadingOptions,
    Rows,
    read_texts,
    strip_controls,
    translate_read,
)

UNKNOWN = "\u2047"
CONTROLS = {chr(c) for c in range(32)} - {"\t", "\n", "\r"}


def _strings(tensor):
    return [t.decode("utf-8") for t in tf.reshape(tensor, [-1]).numpy()]


def test_read_texts_splits_recases_and_keeps_the_separators():
    rows, mapping = read_texts(["  Mr. Smith came. HE SAT DOWN NOW!\n\nOk", "", "A dog."],
                               ReadingOptions(language="en"))
    assert _strings(rows) == ["Mr. Smith came.", "He sat down now!", "Ok", "A dog."]
    assert mapping.text_of.numpy().tolist() == [0, 0, 0, 2]
    out = mapping.join(tf.constant(["X y.", "he sat.", "Z", "B c."]))
    assert _strings(out) == ["  X y. HE SAT.\n\nZ", "", "B c."]


def test_raw_reading_is_the_identity_but_for_controls():
    texts = ["Two dogs. TWO DOGS PLAY NOW.", "a\x00b\x1b c\td\n"]
    rows, mapping = read_texts(texts, RAW)
    assert _strings(rows) == ["Two dogs. TWO DOGS PLAY NOW.", "a b  c\td\n"]
    assert mapping.join(rows) is rows


def test_rows_sum_any_notes_and_concat():
    mapping = Rows(tf.constant([0, 0, 2]), tf.ragged.constant([["", " ", ""], [""], ["", ""]]),
                   None, tf.constant(3))
    assert mapping.sum(tf.constant([1.0, 2.0, 4.0]), -1.0).numpy().tolist() == [3.0, -1.0, 4.0]
    assert mapping.any(tf.constant([False, True, False])).numpy().tolist() == [True, False,
                                                                               False]
    assert _strings(mapping.notes(tf.constant(["a", "b", "c"]), "-")) == ["a; b", "-", "c"]
    fills = tf.constant(["x", "y", "z"])
    assert _strings(mapping.notes(tf.constant(["", "b", ""]), fills)) == ["b", "y", ""]
    values = tf.constant([[[1, 2, 0]], [[3, 0, 0]], [[4, 5, 6]]])  # (S, K=1, T)
    joined = mapping.concat(values, tf.constant([[2], [1], [3]]))
    assert joined.numpy().tolist() == [[[1, 2, 3]], [[0, 0, 0]], [[4, 5, 6]]]


def test_clean_drops_controls_and_unknown_pieces_the_source_had_not():
    mapping = Rows(tf.range(3), None, None, tf.constant(3))
    out = mapping.clean(tf.constant([f"Ein {UNKNOWN} Hund\x00\x01.", f"{UNKNOWN} B",
                                     f"C {UNKNOWN}"]), tf.constant([False, False, True]))
    assert _strings(out) == ["Ein Hund.", "B", f"C {UNKNOWN}"]
    assert _strings(strip_controls(["a\x00\x07b\tc\r\n"])) == ["a  b\tc\r\n"]


def test_translate_read_wraps_a_python_translate_function():
    def upper_first(rows):
        return [f"<{row}>" for row in rows]

    out = translate_read(["ONE TWO THREE. Four five.\n", b"", "x\x00y"], upper_first,
                         ReadingOptions(language="en"))
    assert out == ["<ONE TWO THREE.> <Four five.>\n", "", "<x y>"]


@pytest.fixture(scope="module")
def translators(tiny_export, spm_model):
    """In-process translators of `tiny_export`'s weights: (as exported, raw), 64 rows a
    chunk."""
    from tfxformer import Transformer
    from tfxformer.serving import Translator

    model = Transformer.from_preset(tiny_export)
    options = dict(TINY_EXPORT_OPTIONS, max_batch_size=64)
    return (Translator(model, spm_model, **options),
            Translator(model, spm_model, reading=RAW, **options))


HOSTILE = [
    " ".join(["A dog runs."] * 20),
    b"\xff\xfe A dog. \xc3 Two \xe2\x82 cats.",
    "",
    "   \n\n\t  \n",
    "word " * 2000,
    "A\x00\x01\x02 dog\x1b[31m runs.\x7f",
    "Ein Hund. 一只狗在跑。 Собака бежит. كلب يجري. 🐕 runs.",
    "TWO DOGS PLAY. Two Dogs Are Playing Here.",
]


def _no_new_junk(source, translation):
    source = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    assert not (set(translation) & CONTROLS), (source[:40], translation[:80])
    if UNKNOWN not in source:
        assert UNKNOWN not in translation, (source[:40], translation[:80])


def test_hostile_text_gets_a_defined_translation(translators):
    out = translators[0](tf.constant(HOSTILE))
    translations = [t.decode("utf-8") for t in out["translation"].numpy()]  # valid UTF-8
    assert len(translations) == len(HOSTILE) and translations[2:4] == ["", ""]
    assert translations[0].count("\n") == 0 and out["truncated"].numpy()[4]
    for source, translation in zip(HOSTILE, translations, strict=True):
        _no_new_junk(source, translation)


def test_a_clean_sentence_is_unchanged_and_a_paragraph_joined(translators):
    default, raw = translators
    clean = ["A dog runs in the park.", "Two men talk", "A woman, a man and a child."]
    assert (default(tf.constant(clean))["translation"].numpy().tolist()
            == raw(tf.constant(clean))["translation"].numpy().tolist())
    parts = raw(tf.constant(["A dog runs.", "Two men talk.", "A child plays."]))
    whole = default(tf.constant(["A dog runs.\n\nTwo men talk. A child plays."]))
    first, second, third = _strings(parts["translation"])
    assert _strings(whole["translation"]) == [f"{first}\n\n{second} {third}"]
    assert whole["score"].numpy()[0] == pytest.approx(parts["score"].numpy().sum(), 1e-5)


@pytest.mark.slow
def test_hostile_text_through_the_exported_nbest_and_score(tiny_export):
    signatures = tf.saved_model.load(tiny_export).signatures
    n = len(HOSTILE)
    ones = lambda value, dtype: tf.fill([n], tf.constant(value, dtype))  # noqa: E731
    nbest = signatures["translate_nbest"](
        text=tf.constant(HOSTILE), beam_size=ones(2, tf.int32), alpha=ones(0.6, tf.float32),
        extra_length=ones(4, tf.int32), max_input_tokens=ones(48, tf.int32),
        num_hypotheses=ones(2, tf.int32), no_repeat_ngram_size=ones(0, tf.int32),
        repetition_penalty=ones(1.0, tf.float32),
        target_prefix=ones("Ein \x00\x01\x02 \u2047", tf.string),
        constraints=ones("Hund\x00", tf.string))
    assert nbest["translations"].shape == (n, 2)
    for source, row in zip(HOSTILE, nbest["translations"].numpy(), strict=True):
        for translation in row:
            _no_new_junk(source, translation.decode("utf-8"))
    scored = signatures["score"](text=tf.constant(HOSTILE), target=tf.constant(["Ein."] * n))
    assert scored["log_prob"].shape == (n,)


@pytest.mark.slow
def test_a_thousand_sentences_in_one_text(translators):
    text = " ".join(f"Dog {i} runs." for i in range(1000))
    out = translators[0](tf.constant([text, "A cat."]))
    translation = out["translation"].numpy()[0].decode("utf-8")
    assert translation.count(" ") >= 999 and not out["truncated"].numpy()[0]
    _no_new_junk(text, translation)


@pytest.mark.slow
def test_a_paragraphs_nbest_list_prefix_and_score(translators):
    default, raw = translators
    # n-best: hypothesis k joins each sentence's k-th; the prefix goes with the first
    options = [tf.constant([v]) for v in (3, 0.6, 4, 48, 2, 0, 1.0)]
    lists = default.translate_nbest(tf.constant(["A dog runs. Two men talk."]), *options,
                                    tf.constant(["Ein"]), tf.constant([""]))
    alone = raw.translate_nbest(tf.constant(["A dog runs.", "Two men talk."]),
                                *[tf.concat([o, o], 0) for o in options],
                                tf.constant(["Ein", ""]), tf.constant(["", ""]))
    one, two = _strings(alone["translations"][:, 0])
    assert _strings(lists["translations"][:, 0]) == [f"{one} {two}"]
    assert lists["scores"].numpy()[0, 0] == pytest.approx(
        alone["scores"].numpy()[:, 0].sum(), 1e-5)
    pieces = [[p for p in _strings(alone["tokens"][i, 0]) if p] for i in range(2)]
    assert [p for p in _strings(lists["tokens"][0, 0]) if p] == pieces[0] + pieces[1]
    # score: a text is scored as one sequence, as it is
    pair = dict(text=tf.constant(["A dog runs. Two men talk."]),
                target=tf.constant(["Ein Hund."]))
    assert default.score(**pair)["log_prob"].numpy() == pytest.approx(
        raw.score(**pair)["log_prob"].numpy())


def test_an_export_records_how_it_reads(tiny_export, spm_model):
    from tfxformer.rundir import RunRecord
    from tfxformer.serving.export import reading_options
    from tfxformer.serving.text import TextCodec

    with open(os.path.join(tiny_export, "assets", "config.json")) as f:
        config = json.load(f)
    assert config["input"] == {"sentence_split": True, "recase": True, "language": None,
                               "markup": True}
    record = RunRecord.from_dict({**config, "src": "de"})
    assert reading_options(record, False, True) == ReadingOptions(False, True, "de")
    no_markup = reading_options(record, markup=False)  # scripts/export.py --no-markup
    assert not no_markup.markup and not TextCodec(spm_model, reading=no_markup).markup
    assert ReadingOptions(language="de").split_rules()["ordinals"]
    assert ReadingOptions(language="xx").split_rules() == {}


def test_export_flags_turn_each_reading_off():
    from support.serving import load_script

    parser = load_script("export").build_parser()
    assert "--no-sentence-split" in parser.format_help()
    args = parser.parse_args(["--model", "m", "--export-dir", "e",
                                      "--no-sentence-split"])
    assert (args.sentence_split, args.recase) == (False, True)
