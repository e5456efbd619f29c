"""tfxformer.serving.casing: which texts are ALL CAPS or Title Case, and the conversions."""

import pytest
import tensorflow as tf

from tfxformer.serving import casing


def _kinds(texts):
    return [casing.KINDS[k] for k in casing.classify(tf.constant(texts)).numpy()]


def _strings(tensor):
    return [s.decode("utf-8") for s in tensor.numpy()]


@pytest.mark.parametrize("text, kind", [
    ("TWO DOGS ARE PLAYING IN THE SNOW.", "upper"),
    ("HELLO, WORLD!", "upper"),
    ("DIE STRASSE IST GRÜN.", "upper"),
    ("ΔΥΟ ΣΚΥΛΙΑ ΠΑΙΖΟΥΝ.", "upper"),            # Greek is cased
    ("A 2 B", "as_is"),                          # no word of two capitals
    ("NASA", "as_is"),                           # one word
    ("NASA FBI", "upper"),
    ("NASA launches a rocket", "as_is"),
    ("iPhone", "as_is"),
    ("The new iPhone Is Here Now", "as_is"),     # an inner capital
    ("Two Dogs Are Playing In The Snow.", "title"),
    ("Man's Dog Runs Home", "title"),            # either case after inner punctuation
    ("A Father-figure In A Blue T-shirt", "title"),
    ("A Well-Known Tug-of-war", "title"),
    ("A Woman On A Boat Named \"el Corazon\"", "as_is"),  # a word's first letter
    ("Two Dogs Play In 3-year-old Snow", "as_is"),
    ("Ünter Äpfel Ößen", "title"),
    ("Two Dogs Play", "title"),
    ("Two Dogs", "as_is"),                       # fewer than three words
    ("Dogs in the Snow", "as_is"),               # a lowercase word
    ("Two dogs are playing in the snow.", "as_is"),
    ("Zwei Hunde spielen im Schnee.", "as_is"),  # German nouns are capitalised
    ("Hello", "as_is"),
    ("HELLO", "as_is"),
    ("123 456 789", "as_is"),
    ("中文 文本 在这里", "as_is"),                  # a script without case
    ("东京 TOKYO CITY", "upper"),                # its cased letters decide
    ("", "as_is"),
    ("   ", "as_is"),
])
def test_classify(text, kind):
    assert _kinds([text]) == [kind]


def test_classify_keeps_invalid_utf8_as_is():
    assert _kinds([b"AB\xff CD EF", b"\xff"]) == ["as_is", "as_is"]


def test_to_model_case_lowers_and_capitalises_sentence_starts():
    texts = ["TWO DOGS ARE PLAYING IN THE SNOW.", "Two Dogs Are Playing In The Snow.",
             "  TWO DOGS.\nA CAT?! \"NO.\" (SURE.) YES", "«ÇA VA ?» OUI.",
             "DIE STRASSE IST GRÜN. ÄPFEL!", "ΔΥΟ ΣΚΥΛΙΑ.", "NASA launches a rocket",
             "2 DOGS RUN."]
    kinds = casing.classify(texts)
    assert _strings(casing.to_model_case(texts, kinds)) == [
        "Two dogs are playing in the snow.", "Two dogs are playing in the snow.",
        "  Two dogs.\nA cat?! \"No.\" (Sure.) Yes", "«Ça va ?» Oui.",
        "Die strasse ist grün. Äpfel!", "Δυο σκυλια.", "NASA launches a rocket",
        "2 dogs run."]


def test_to_source_case():
    out = ["Zwei Hunde spielen im Schnee.", "Die Maße der Straße, die Masse.",
           "zwei hunde \"spielen\" im schnee. (das) ist groß", "iPhone bleibt so."]
    kinds = [casing.UPPER, casing.UPPER, casing.TITLE, casing.AS_IS]
    assert _strings(casing.to_source_case(out, kinds)) == [
        "ZWEI HUNDE SPIELEN IM SCHNEE.", "DIE MAẞE DER STRAẞE, DIE MASSE.",
        "Zwei Hunde \"Spielen\" Im Schnee. (Das) Ist Groß", "iPhone bleibt so."]


def test_in_a_graph_round_trip_of_kinds():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def echo(texts):
        kinds = casing.classify(texts)
        return casing.to_source_case(casing.to_model_case(texts, kinds), kinds)

    texts = ["TWO DOGS PLAY.", "Two Dogs Play Outside", "Two dogs play.", "", "x"]
    assert _strings(echo(tf.constant(texts))) == [
        "TWO DOGS PLAY.", "Two Dogs Play Outside", "Two dogs play.", "", "x"]
    assert echo(tf.constant([], tf.string)).numpy().tolist() == []


def test_title_cased_output_classifies_as_title():
    """to_source_case's Title Case is one classify calls TITLE (and UPPER the same)."""
    out = ["ein hund mit t-shirt rennt.", "zwei kinder spielen tauziehen", "große straße hier"]
    for kind in (casing.TITLE, casing.UPPER):
        cased = casing.to_source_case(out, [kind] * len(out))
        assert casing.classify(cased).numpy().tolist() == [kind] * len(out)
    assert _strings(tf.strings.lower(casing.to_source_case(out[2:], [casing.UPPER]),
                                     encoding="utf-8")) == out[2:]


def test_kinds_are_checked():
    with pytest.raises(tf.errors.InvalidArgumentError, match="kinds are"):
        casing.to_model_case(["a"], [3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one kind per text"):
        casing.to_source_case(["a", "b"], [0])
