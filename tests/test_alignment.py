"""Word alignments from the encoder–decoder attention (tfxformer.serving.alignment)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_EXPORT_OPTIONS, tiny_export_translator

from tfxformer import Transformer
from tfxformer.ids import EOS_ID, PAD_ID
from tfxformer.serving.alignment import align_rows, pharaoh, word_index


def test_word_index_follows_the_word_start_marker():
    pieces = tf.constant([["▁A", "▁do", "g", "▁runs", "</s>"],
                          ["<2de>", "▁x", "y", "▁z", "<pad>"]])
    real = tf.constant([[True] * 4 + [False], [True] * 4 + [False]])
    words = word_index(pieces, real, tf.constant([0, 1]))
    assert words.numpy()[0, :4].tolist() == [0, 1, 1, 2]
    assert words.numpy()[1, 1:4].tolist() == [0, 0, 1]  # the tag piece belongs to no word


def test_word_index_starts_a_word_at_the_first_piece_without_marker():
    words = word_index(tf.constant([["ab", "c", "▁d"]]), tf.ones([1, 3], bool))
    assert words.numpy().tolist() == [[0, 0, 1]]


def test_pharaoh_lists_each_pair_once_sorted():
    source = tf.constant([[2, 0, 0, 1], [0, 0, 0, 0]])
    target = tf.constant([[0, 1, 1, 2], [0, 0, 0, 0]])
    real = tf.constant([[True, True, True, True], [False] * 4])
    assert pharaoh(source, target, real).numpy().tolist() == [b"0-1 1-2 2-0", b""]


class _ForcedAttention:
    """A model whose every target piece attends the source piece `link[t]`."""

    def __init__(self, link):
        self.link = link

    def encode(self, source_ids):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0)), source_ids != PAD_ID

    def cross_attention(self, inputs, memory, source_mask, layer):
        return tf.one_hot([self.link], tf.shape(memory)[1])


class _Pieces:
    """A tokenizer's `id_to_string` over a fixed vocabulary."""

    def __init__(self, vocabulary):
        self.vocabulary = tf.constant(vocabulary)

    def id_to_string(self, ids):
        return tf.gather(self.vocabulary, ids)


VOCABULARY = ["<pad>", "<unk>", "<s>", "</s>", "▁a", "▁b", "▁c", "▁x", "▁y", "z"]


@pytest.mark.parametrize("reverse", [False, True])
def test_alignments_come_in_reading_order(reverse):
    source = tf.constant([[4, 5, 6, EOS_ID]])  # a b c
    reading = [7, 8, 9]  # "x yz": words 0, 1, 1
    # target piece t (reading order) attends source piece [0, 2, 1][t]
    links = [0, 2, 1]
    if reverse:  # the model reads the pieces right to left, EOS last
        reading, links = reading[::-1], links[::-1]
    target = tf.constant([reading + [EOS_ID]])
    model = _ForcedAttention(links + [3])
    out = align_rows(model, source, target, _Pieces(VOCABULARY), reverse_target=reverse)
    assert out.numpy().tolist() == [b"0-0 1-1 2-1"]


def test_eos_and_padding_are_never_linked():
    source = tf.constant([[4, EOS_ID, PAD_ID]])
    model = _ForcedAttention([1, 2])  # all the weight on EOS, then on padding
    out = align_rows(model, source, tf.constant([[7, EOS_ID]]), _Pieces(VOCABULARY))
    assert out.numpy().tolist() == [b"0-0"]


def test_cross_attention_is_the_head_average_of_the_decoders_weights():
    model = Transformer.from_preset("tiny", vocab_size=40)
    source, target = tf.constant([[5, 6, 7, 3, 0]]), tf.constant([[2, 8, 9]])
    memory, mask = model.encode(source)
    logits, weights = model.decode(target, memory, mask, return_attention_scores=True)
    for layer in (0, -1):
        expected = tf.reduce_mean(weights[layer]["cross"], axis=1)
        np.testing.assert_allclose(model.cross_attention(target, memory, mask, layer),
                                   expected, atol=1e-6)
    np.testing.assert_allclose(model.decode(target, memory, mask), logits, atol=1e-6)
    again = Transformer.from_config(model.get_config())
    assert again.get_config() == model.get_config()
    with pytest.raises(ValueError, match="`layer`"):
        model.cross_attention(target, memory, mask, len(model.decoder.stack))


def test_translate_nbest_gives_alignments_within_the_words(tiny_export, spm_model):
    translator = tiny_export_translator(tiny_export, spm_model)
    texts = ["A dog runs on the beach.", "", "Two men play."]
    out = translator.translate_nbest(
        tf.constant(texts), *(tf.fill([3], v) for v in (
            TINY_EXPORT_OPTIONS["beam_size"], 0.6, 4, 32, 2, 0)),
        tf.fill([3], 1.0), tf.fill([3], ""), tf.fill([3], ""))
    alignments = out["alignments"].numpy()
    assert alignments.shape == out["translations"].shape
    for text, row, translations in zip(texts, alignments, out["translations"].numpy(),
                                       strict=True):
        for links, translation in zip(row, translations, strict=True):
            words = len(translation.split())
            assert words or links == b""  # (the untrained model's pieces may read back
            # as unknown ones, which link nothing: an empty alignment is allowed)
            for pair in links.split():
                i, j = map(int, pair.split(b"-"))
                assert 0 <= i < len(text.split()) and 0 <= j < words


def test_a_texts_alignment_joins_its_sentence_rows():
    from types import SimpleNamespace

    from tfxformer.serving.alignment import text_alignments
    from tfxformer.serving.reading import Rows

    rows = Rows(tf.constant([0, 0, 1]), tf.ragged.constant([["", " ", ""], ["", ""]]), None,
                tf.constant(2))
    source = SimpleNamespace(rows=rows, row_words=tf.constant([2, 3, 1]))
    out = text_alignments(source, tf.constant([["0-0 1-1"], ["0-1 2-0"], ["0-0"]]),
                          tf.constant([["A B"], ["C D E"], ["F"]]))
    assert out.numpy().tolist() == [[b"0-0 1-1 2-3 4-2"], [b"0-0"]]


def test_moses_lines_end_with_the_alignment():
    from tfxformer.serving.nbest import Hypothesis, moses_lines

    h = Hypothesis("Ein Hund.", -0.5, ("▁Ein", "▁Hund", ".", "</s>"), (-0.1, -0.2, -0.1, -0.1),
                   "0-0 1-1")
    assert moses_lines(2, [h], alignments=True) == ["2 ||| Ein Hund. ||| -0.500000 ||| 0-0 1-1"]
    assert moses_lines(2, [h], token_scores=True, alignments=True)[0].endswith(
        "</s>=-0.100000 ||| 0-0 1-1")


@pytest.mark.slow  # starts scripts/translate.py on the export
def test_translate_script_prints_alignments(tiny_export, spm_model):
    from support.serving import run_script

    sources = ["A dog runs.", "Two men play in a park."]
    stdout = run_script("translate", ["--model", tiny_export, "--alignments"],
                        stdin="".join(s + "\n" for s in sources).encode())
    translator = tiny_export_translator(tiny_export, spm_model)
    here = translator.translate_nbest(
        tf.constant(sources), *(tf.fill([2], v) for v in (3, 0.6, 4, 32, 1, 0)),
        tf.fill([2], 1.0), tf.fill([2], ""), tf.fill([2], ""))
    expected = [f"{t.decode()} ||| {a.decode()}" for t, a in zip(
        here["translations"].numpy()[:, 0], here["alignments"].numpy()[:, 0], strict=True)]
    assert stdout.split("\n")[:-1] == expected


def _placed(translator, texts, constraints):
    """(each row's constraints after place_phrases, each text's rows' constraints)."""
    from tfxformer.serving.alignment import place_phrases
    from tfxformer.serving.nbest_request import first_rows

    texts = tf.constant(texts)
    source = translator.read(texts, tf.fill(tf.shape(texts), 48))
    constraints = tf.constant(constraints)
    _, first, _ = first_rows(tf.size(texts), source.rows, tf.fill(tf.shape(texts), ""),
                             constraints)
    placed = place_phrases(translator, source, constraints, translator.make_tokenizer(), first)
    rows = [r.decode() for r in placed.numpy()]
    text_of = source.rows.text_of.numpy().tolist()
    per_text = [[rows[r] for r, t in enumerate(text_of) if t == n] for n in range(len(texts))]
    return rows, [r.decode("utf-8", "replace") for r in first.numpy()], per_text


def test_each_constraint_goes_to_one_sentence_of_its_text(tiny_export, spm_model):
    translator = tiny_export_translator(tiny_export, spm_model)
    many = "\t".join(f"w{i}" for i in range(300))
    texts = ["A dog runs. A cat sleeps. Two men play.", "One sentence.", "   ",
             "A b. C d.", "E f. G h."]
    constraints = ["Hund\tKatze\tMänner", "Hund", "Hund", b"\xff a\t\tb", many]
    rows, first, per_text = _placed(translator, texts, constraints)
    for n, expected in ((0, ["Hund", "Katze", "Männer"]), (3, ["\ufffd a", "", "b"]),
                        (4, many.split("\t"))):
        placed = [p for row in per_text[n] if row for p in row.split("\t")]
        assert sorted(placed) == sorted(p for p in expected if p), n
        for row in per_text[n]:  # each row keeps the text's order
            phrases = [p for p in row.split("\t") if p]
            assert phrases == [p for p in expected if p in phrases], n
    assert per_text[1] == ["Hund"] and per_text[2] == []  # one row; no row (blank)
    # no text of several rows (not blank) with constraints: each text's on its first row
    rows, first, _ = _placed(translator, ["A dog runs. A cat sleeps.", "Two."], ["", "x"])
    assert rows == first == ["", "", "x"]
    # two identical rows fit a phrase alike: it goes to one of them (which one, float
    # rounding of the batch's rows decides)
    rows, first, _ = _placed(translator, ["…\n…"], ["Hund"])
    assert sorted(rows) == ["", "Hund"] and first == ["Hund", ""]


@pytest.mark.slow  # the shipped EN->DE model: a greedy pass and a teacher-forced one
def test_constraints_go_to_the_sentence_that_translates_them():
    import os

    from tfxformer.serving import Translator, resolve_model_dir

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _, version = resolve_model_dir(os.path.join(root, "saved_models", "multi30k_en_de"))
    with open(os.path.join(version, "assets", "spm.model"), "rb") as f:
        translator = Translator(Transformer.from_preset(version), f.read(), beam_size=4)
    _, _, per_text = _placed(
        translator, ["A dog runs in the park. A woman sits on a bench.",
                     "Two men are talking. A child plays with a red ball."],
        ["Bank\tHund", "Ball\tMänner"])
    assert per_text == [["Hund", "Bank"], ["Männer", "Ball"]]
