"""tfxformer.serving.segment: where texts split into sentences, and join(split(x)) == x."""

import pytest
import tensorflow as tf

from tfxformer.serving import casing, segment


def _split(texts, language="en"):
    """(sentences, separators) of each text as lists of str."""
    parts = segment.split(tf.constant(texts), **segment.rules(language))
    sentences, separators = ([[s.decode("utf-8", "replace") for s in row] for row in x.to_list()]
                             for x in parts)
    return list(zip(sentences, separators, strict=True))


def _encoded(texts):
    return [t if isinstance(t, bytes) else t.encode("utf-8") for t in texts]


def _round_trip(texts, language="en"):
    parts = segment.split(tf.constant(texts), **segment.rules(language))
    assert segment.join(*parts).numpy().tolist() == _encoded(texts)
    return parts


@pytest.mark.parametrize("text", [
    "Two dogs are playing in the snow.",
    "A man in an orange hat starring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "no final period",
])
def test_a_clean_sentence_is_one_sentence_equal_to_the_input(text):
    assert _split([text]) == [([text], ["", ""])]


def test_sentence_ends_and_the_separators_kept_exactly():
    text = "  It rains. Two dogs play!\tA man waits?!  \"Yes.\" (Really.) 3 cats sleep… Ok  "
    assert _split([text]) == [(
        ["It rains.", "Two dogs play!", "A man waits?!", "\"Yes.\"", "(Really.)",
         "3 cats sleep…", "Ok"],
        ["  ", " ", "\t", "  ", " ", " ", " ", "  "])]
    _round_trip([text])


@pytest.mark.parametrize("text", [
    "It costs 3.5 dollars.",                   # inside a number
    "He said no. and left.",                   # before a lowercase letter
    "Wait... what?",
    "Mr. Smith and Dr. Jones met Prof. Brown.",
    "Apples, pears, etc. Both were fresh.",    # a known abbreviation, even at an end
    "J. Smith wrote it.",                      # a single initial
    "He lives in the U.S. He works there.",    # letters and periods: conservative
    "Bring e.g. Bread and i.e. Butter.",
    "Hello.World is one word.",                # no whitespace, no boundary
])
def test_no_boundary(text):
    assert _split([text]) == [([text], ["", ""])]


def test_abbreviations_follow_the_language():
    de = "Er kam z.B. am Mo. an, vgl. S. 30 oben. Nr. 5 ist da. Dr. Meier bzw. Fr. Kurz kommen."
    assert _split([de], "de")[0][0] == ["Er kam z.B. am Mo. an, vgl. S. 30 oben.",
                                        "Nr. 5 ist da.", "Dr. Meier bzw. Fr. Kurz kommen."]
    fr = "M. Dupont et Mme Durand, p.ex. Jean. Il part."
    assert _split([fr], "fr")[0][0] == ["M. Dupont et Mme Durand, p.ex. Jean.", "Il part."]
    # "Mme." is not an English abbreviation: the English rules split after it.
    assert len(_split(["Mme. Durand"], "en")[0][0]) == 2
    # A lowercase entry matches capitalised too ("Vgl." at a sentence start).
    assert _split(["Vgl. Abschnitt 3."], "de")[0][0] == ["Vgl. Abschnitt 3."]


def test_ordinals_only_where_the_language_has_them():
    text = "Am 3. Mai kam er. Es war 1999. Dann ging er."
    assert _split([text], "de")[0][0] == ["Am 3. Mai kam er.", "Es war 1999. Dann ging er."]
    assert _split(["It was 1999. Then he left."])[0][0] == ["It was 1999.", "Then he left."]


def test_quotes_brackets_and_other_scripts():
    assert _split(["Er sagte: „Hallo.“ Dann ging er. «Oui.» Non."], "de")[0][0] == [
        "Er sagte: „Hallo.“", "Dann ging er.", "«Oui.»", "Non."]
    assert _split(["It ends. 中文在这里。 Then more."])[0][0] == [
        "It ends.", "中文在这里。", "Then more."]
    # A no-break space is never a boundary (French spacing before ? and !).
    assert _split(["Quoi\u00a0? Il part.\u00a0Non."], "fr")[0][0] == [
        "Quoi\u00a0?", "Il part.\u00a0Non."]


def test_a_missing_final_period_before_an_opener_splits_english_only():
    text = "Two dogs play in the snow A man in a red shirt rides a bike A woman sits."
    sentences = ["Two dogs play in the snow", "A man in a red shirt rides a bike",
                 "A woman sits."]
    assert _split([text]) == [(sentences, ["", " ", " ", ""])]
    _round_trip([text])
    assert _split([text], "de") == [([text], ["", ""])]      # German: no openers
    assert _split([text], "fr") == [([text], ["", ""])]


@pytest.mark.parametrize("text", [
    "He studied theology after his exams (equivalent to A levels).",  # an opener near the end
    "A person looks out of the window on the A bus.",
    "Spring A came",                                  # too few words on either side
    "The class reads The Hobbit and The Lord of the Rings.",  # a capitalised word follows
    "They took Plan A instead of plan B.",            # after a capitalised word
    "dogs in the snow, A man rides a bike",           # after punctuation that ends nothing
    "TWO DOGS PLAY IN THE SNOW A MAN RIDES A BIKE",   # no lowercase word before it
])
def test_no_boundary_before_an_opener(text):
    assert _split([text]) == [([text], ["", ""])]


def test_newlines_always_split_and_are_kept():
    text = "First line\nsecond line\r\n\r\nthird. fourth\u2028Fifth\n"
    assert _split([text]) == [(
        ["First line", "second line", "third. fourth", "Fifth"],
        ["", "\n", "\r\n\r\n", "\u2028", "\n"])]
    _round_trip([text])


@pytest.mark.parametrize("text, expected", [
    ("", ([], [""])),
    ("   ", ([], ["   "])),
    ("\n", ([], ["\n"])),
    ("\n\n\n \n", ([], ["\n\n\n \n"])),
    ("...", (["..."], ["", ""])),
    ("?! ... !!!", (["?! ... !!!"], ["", ""])),   # no word to start a sentence
    (". . .", ([". . ."], ["", ""])),
    ("?! ... \"!\"", (["?! ...", "\"!\""], ["", " ", ""])),  # an opening quote starts one
])
def test_empty_whitespace_and_punctuation_only(text, expected):
    assert _split([text]) == [expected]
    _round_trip([text])


def test_invalid_utf8_is_kept_and_does_not_fail():
    texts = [b"ab\xff. Cd. \xffX. Y", b"\xc3", b"\xff\xfe\n\xfd"]
    parts = _round_trip(texts)
    assert parts.sentences.to_list() == [[b"ab\xff.", b"Cd. \xffX.", b"Y"], [b"\xc3"],
                                         [b"\xff\xfe", b"\xfd"]]


def test_long_texts():
    many = " ".join(f"Sentence {i} is here." for i in range(1000))
    one_word, words = "a" * 100_000, "word " * 20_000
    parts = _round_trip([many, one_word, words, "\n" * 100_000, "." * 100_000])
    assert parts.sentences.row_lengths().numpy().tolist() == [1000, 1, 1, 0, 1]
    assert parts.sentences[0][999].numpy() == b"Sentence 999 is here."
    assert parts.separators[2][1].numpy() == b" "


def test_batch_of_mixed_texts_in_a_graph_and_translated_sentences_joined():
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def shout(texts):
        parts = segment.split(texts, **segment.rules("en"))
        # Stands for a translation: each sentence replaced by another string.
        loud = tf.strings.upper(parts.sentences.flat_values)
        return segment.join(parts.sentences.with_flat_values(loud), parts.separators)

    texts = [" One. Two!\n\nThree ", "", "single", "  \n"]
    assert shout(tf.constant(texts)).numpy().tolist() == [
        b" ONE. TWO!\n\nTHREE ", b"", b"SINGLE", b"  \n"]
    assert shout(tf.constant([], tf.string)).numpy().tolist() == []


def test_the_graph_holds_core_and_tensorflow_text_ops_only():
    """What TF Serving runs: split, casing and join traced together, no py_function."""
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def robust(texts):
        parts = segment.split(texts, **segment.rules("de"))
        kinds = casing.classify(parts.sentences.flat_values)
        out = casing.to_source_case(casing.to_model_case(parts.sentences.flat_values, kinds),
                                    kinds)
        return segment.join(parts.sentences.with_flat_values(out), parts.separators)

    graph = robust.get_concrete_function().graph.as_graph_def()
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function
                                        for n in f.node_def}
    assert "RegexSplitWithOffsets" in ops and "StringUpper" in ops
    assert not {op for op in ops if not hasattr(tf.raw_ops, op)} - {"RegexSplitWithOffsets"}
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}  # core ops, not servable


def test_join_rejects_separators_that_do_not_fit():
    sentences = tf.ragged.constant([["a", "b"]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one separator more"):
        segment.join(sentences, tf.ragged.constant([["", ""]]))


def test_rules_name_the_known_languages():
    with pytest.raises(ValueError, match=r"'xx'.*\['de', 'en', 'fr'\]"):
        segment.rules("xx")
    with pytest.raises(ValueError, match="empty abbreviation"):
        segment.split(["A. B."], abbreviations=["Mr", "."])
    with pytest.raises(ValueError, match="a list of words"):
        segment.split(["A. B."], abbreviations="Mr")
    with pytest.raises(ValueError, match="openers: a list of words"):
        segment.split(["a b c d A e f g"], openers="A")
    with pytest.raises(ValueError, match="openers: words without whitespace"):
        segment.split(["a b c d A e f g"], openers=["A", "Some one"])
