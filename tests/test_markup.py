"""Inline markup taken out before translation and put back after it
(tfxformer.serving.markup), and through a translator's signatures."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf
from conftest import tiny_export_translator

from tfxformer.serving.markup import STANDALONE, markup_pattern, put_back, take_out


def _identity(plain):
    """Each plain text's word-by-word identity alignment."""
    count = tf.strings.split(plain).row_lengths()
    index = tf.strings.as_string(tf.ragged.range(count))
    return tf.strings.reduce_join(tf.strings.join([index, "-", index]), axis=1,
                                  separator=" ")


def _round_trip(texts):
    markup = take_out(tf.constant(texts))
    return markup, [t.decode("utf-8") for t in
                    put_back(markup, markup.plain, _identity(markup.plain)).numpy()]


def _stripped(text):
    return re.sub(r"<[^<>]*>", "", text).split()


def _tags(text):
    return re.findall(r"<[^<>]*>|&[#\w]+;|\{[^{}]*\}|%s", text)


def test_tags_entities_and_placeholders_come_back_where_they_were():
    texts = ["A <b>dog</b> runs on the <br/>beach.",
             'Hello {0}, a <a href="x?a=1&amp;b">man &amp; <i>woman</i></a> sit {{name}} %s.']
    markup, out = _round_trip(texts)
    assert out == texts
    assert [t.decode() for t in markup.plain.numpy()] == [
        "A dog runs on the beach.", "Hello , a man woman sit ."]


def test_text_without_markup_is_left_byte_for_byte():
    texts = ["no  markup here ", "3 < 5 and 6 > 2", "50% off", "a & b", ""]
    markup, out = _round_trip(texts)
    assert out == texts
    assert [t.decode() for t in markup.plain.numpy()] == texts
    assert not markup.marked.numpy().any()


@pytest.mark.parametrize("text", [
    "<b>unbalanced <i>x</b>", "</i>closing first <b>", "<br>void", "dog<b>s</b> run",
    "a < b <i>c</i>", "<b></b>", "<br/>", "<b>a</b><i>b</i>", "x<!-- note -->y",
    "<a title='1 > 0'>x</a>"])
def test_hostile_markup_keeps_every_item_in_order(text):
    markup, (out,) = _round_trip([text])
    assert _tags(out) == _tags(text)
    # the words come back; markup inside a word moves to its edge
    assert _stripped(out) == _stripped(text)


def test_unbalanced_tags_are_standalone():
    markup = take_out(tf.constant(["<b>unbalanced <i>x</b>"]))
    assert markup.kinds.numpy().tolist() == [STANDALONE] * 3


def test_invalid_utf8_gives_a_defined_output():
    from tfxformer.serving.text import sanitize_utf8

    markup, (out,) = _round_trip([sanitize_utf8(tf.constant([b"bad \xff <b>x</b>"]))[0]
                                  .numpy().decode()])
    assert out == "bad \ufffd <b>x</b>"


def test_items_follow_the_alignment_and_keep_their_order():
    markup = take_out(tf.constant(["A <b>dog</b> runs on the <br/>beach."]))
    # "Am Strand rennt ein Hund ." : dog -> 4, beach. -> 1, the -> 0
    out = put_back(markup, tf.constant(["Am Strand. rennt ein Hund"]),
                   tf.constant(["0-3 1-4 2-2 4-0 5-1"]))
    # <br/> would go before "Strand." (left of </b>): it moves after </b>, keeping order
    assert out.numpy()[0].decode() == "Am Strand. rennt ein <b>Hund</b> <br/>"


def test_n_best_translations_each_get_the_markup():
    markup = take_out(tf.constant(["<b>x</b> y", "plain"]))
    out = put_back(markup, tf.constant([["X Y", "Y X"], ["P", "Q"]]),
                   tf.constant([["0-0 1-1", "0-1 1-0"], ["0-0", "0-0"]]))
    assert out.numpy().tolist() == [[b"<b>X</b> Y", b"Y <b>X</b>"], [b"P", b"Q"]]


def test_placeholder_patterns_are_checked():
    assert "\\[\\[\\w+\\]\\]" in markup_pattern([r"\[\[\w+\]\]"])
    with pytest.raises(ValueError, match="placeholder pattern"):
        markup_pattern(["("])
    with pytest.raises(ValueError, match="sequence of patterns"):
        markup_pattern(r"\{\d\}")


@pytest.mark.slow  # traces two translators' graphs
def test_translator_keeps_markup_and_leaves_clean_text_alone(tiny_export, spm_model):
    from tfxformer import Transformer
    from tfxformer.serving import Translator

    translator = tiny_export_translator(tiny_export, spm_model)
    texts = ["A <b>dog</b> runs on the <br/>beach.", "A dog runs on the beach.", "<br/>",
             "3 < 5"]
    out = [t.decode() for t in translator(tf.constant(texts))["translation"].numpy()]
    for text, translation in zip(texts, out, strict=True):
        assert _tags(translation) == _tags(text)
    off = Translator(Transformer.from_preset(tiny_export), spm_model, markup=False,
                     beam_size=3, extra_length=4, max_batch_size=3)
    plain = off(tf.constant(texts[1:2]))["translation"].numpy()
    assert plain[0].decode() == out[1]  # clean text: the same with markup on or off
    # with markup read as text, a paragraph's n-best list still has its alignments
    listed = off.translate_nbest(
        tf.constant(["A dog runs. Two men play."]),
        *(tf.constant([v]) for v in (3, 0.6, 4, 32, 2, 0)),
        tf.constant([1.0]), tf.constant([""]), tf.constant([""]))
    assert listed["alignments"].shape == listed["translations"].shape
