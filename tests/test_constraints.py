"""Terminology constraints (tfxformer.decoding.constraints, docs/steering.md): lexically
constrained beam search with dynamic beam allocation, in process, in the exported
`translate_nbest` signature and in scripts/translate.py --constraints-file."""

import numpy as np
import pytest
import tensorflow as tf
from support.serving import saved_models_loaded_once

from tfxformer.decoding import EOS_ID, DecodeStart, beam_search, greedy_decode
from tfxformer.decoding.adapter import output_limits
from tfxformer.decoding.beam_search import sequence_beam_search
from tfxformer.decoding.constraints import ConstraintState, _advance
from tfxformer.decoding.steering import make_steering

VOCAB = 30


@pytest.fixture(scope="module", autouse=True)
def _export_loaded_once():
    """conftest's tiny export is loaded once for the module: load_nbest_fn and translate.py
    here test what they do with it (test_serving.py tests loading it)."""
    with saved_models_loaded_once():
        yield


def bigram_start(source_ids, beams, extra_length=12, seed=3):
    """A step function with random bigram log-probabilities (the next token depends on
    the last one) and EOS more likely from position 4 on, so hypotheses end early."""
    rng = np.random.default_rng(seed)
    table = tf.constant(rng.normal(size=(VOCAB, VOCAB)) * 2.0, tf.float32)
    source_ids = tf.constant(source_ids)
    limits, length = output_limits(tf.not_equal(source_ids, 0), 64, extra_length)
    batch = tf.shape(source_ids)[0]

    def step_fn(ids, index, cache, context):
        bonus = tf.where(index >= 4, 3.0, -3.0)
        eos = tf.one_hot(EOS_ID, VOCAB) * bonus
        return tf.gather(table, ids[:, -1]) + eos[None], cache

    return DecodeStart(step_fn, {"rows": tf.zeros([batch * beams, 1])}, {}, limits, length)


SOURCES = [[5, 6, 7, 8, 3], [9, 10, 11, 3, 0], [12, 13, 3, 0, 0], [14, 3, 0, 0, 0]]


def search(phrases, beams=4, **steer):
    batch = len(SOURCES)
    steering = make_steering(batch, constraints=None if phrases is None else tf.ragged.constant(
        phrases, ragged_rank=2, dtype=tf.int32), **steer)
    return sequence_beam_search(bigram_start(SOURCES, beams), beams, 0.6, steering=steering)


def holds(output, phrase):
    return any(output[i:i + len(phrase)] == phrase for i in range(len(output)))


def outputs(out):
    """Per sentence, its hypotheses as (tokens without EOS, ended by EOS)."""
    lists = []
    for ids, lengths, scores in zip(out.ids.numpy(), out.lengths.numpy(), out.scores.numpy(),
                                    strict=True):
        lists.append([(row[:n][:-1].tolist() if row[n - 1] == EOS_ID else row[:n].tolist(),
                       bool(row[n - 1] == EOS_ID))
                      for row, n, s in zip(ids, lengths, scores, strict=True) if s > -1e8])
    return lists


def test_every_output_that_ends_holds_each_phrase():
    """One token, a phrase of three, two phrases, two phrases with the same first token:
    every output ended by EOS holds each phrase contiguously, and the best one ends."""
    plain = outputs(search(None))
    favourite = plain[0][0][0][0]  # the unconstrained best's first token
    phrases = [[[21, 22, 23]], [[5]], [[favourite, 25], [favourite, 26, 27]],
               [[24, 19], [11]]]
    found = outputs(search(phrases))
    for sentence, wanted in zip(found, phrases, strict=True):
        assert sentence[0][1], sentence  # the best output ended before its limit
        for tokens, ended in sentence:
            if ended:
                assert all(holds(tokens, phrase) for phrase in wanted), (tokens, wanted)
    assert not all(holds(plain[0][0][0], p) for p in phrases[0])  # the search had to work


def test_without_constraints_the_search_is_the_plain_one():
    """No constraint token in the batch: the plain search's ids and scores; in a batch
    where some rows have constraints, the others are decoded as by the plain search."""
    plain = search(None, repetition_penalty=1.0 + 1e-6)
    empty = search([[], [], [], []], repetition_penalty=1.0 + 1e-6)
    np.testing.assert_array_equal(empty.ids, plain.ids)
    np.testing.assert_array_equal(empty.scores, plain.scores)
    mixed = search([[[21, 22]], [], [[17]], []], repetition_penalty=1.0 + 1e-6)
    for row in (1, 3):
        np.testing.assert_array_equal(mixed.ids[row], plain.ids[row])
        np.testing.assert_array_equal(mixed.scores[row], plain.scores[row])


def test_a_static_cache_decodes_as_a_growing_one():
    phrases = tf.ragged.constant([[[21, 22]], [], [[17], [5]], [[24]]], ragged_rank=2)
    steering = make_steering(4, constraints=phrases)
    grown, static = (sequence_beam_search(bigram_start(SOURCES, 3), 3, 0.6, steering=steering,
                                          static_cache=fixed) for fixed in (False, True))
    np.testing.assert_array_equal(grown.ids, static.ids)
    np.testing.assert_allclose(grown.scores, static.scores)


def test_a_prefix_is_forced_first_and_the_phrases_follow():
    out = outputs(search([[[21, 22]], [[17]], [], [[24]]],
                         prefix=tf.ragged.constant([[8, 9], [], [5], [21, 22]])))
    for sentence, prefix, wanted in zip(out, [[8, 9], [], [5], [21, 22]],
                                        [[21, 22], [17], None, [24]], strict=True):
        for tokens, ended in sentence:
            assert tokens[:len(prefix)] == prefix
            if ended and wanted:
                assert holds(tokens, wanted), (tokens, wanted)


def test_a_mismatch_inside_a_phrase_unmeets_it():
    """sockeye's advance(): phrase [5, 6, 7] and phrase [9]; 5 6 8 breaks the phrase,
    and a token that breaks it may start a phrase (here 5 again)."""
    constraints = tf.constant([[5, 6, 7, 9]])
    continues = tf.constant([[True, True, False, False]])
    state = ConstraintState(tf.zeros([1, 1, 4], tf.bool), tf.fill([1, 1], -1))

    def write(state, token):
        met, last = _advance(state.met, state.last, tf.constant([[token]]), constraints,
                             continues)
        return ConstraintState(met, last)

    for token in (5, 6):
        state = write(state, token)
    assert state.met.numpy().tolist() == [[[True, True, False, False]]]
    broken = write(state, 8)
    assert broken.met.numpy().tolist() == [[[False] * 4]] and broken.last.numpy() == -1
    again = write(state, 5)
    assert again.met.numpy().tolist() == [[[True, False, False, False]]]
    done = write(write(state, 7), 9)
    assert done.met.numpy().tolist() == [[[True] * 4]]
    assert write(done, 5).met.numpy().tolist() == [[[True] * 4]]  # met phrases stay met


def test_greedy_decoding_refuses_constraints():
    from tfxformer import Transformer

    model = Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
    steering = make_steering(1, constraints=tf.ragged.constant([[[7]]], ragged_rank=2))
    with pytest.raises(ValueError, match="constraints.*beam search"):
        greedy_decode(model, tf.constant([[5, 3]]), steering=steering)
    out = beam_search(model, tf.constant([[5, 3]]), beam_size=2, extra_length=4,
                      steering=steering)
    assert out.ids.shape[1] == 2


# --- the `translate_nbest` signature's `constraints` input and translate.py


def _pieces_hold(processor, text, phrase):
    """The phrase's pieces, detokenized, are in the text (SentencePiece may cut the text
    anew into other pieces, so the text is compared)."""
    return processor.decode(processor.encode(phrase)) in text


@pytest.mark.slow
def test_the_exported_signature_forces_each_phrase(tiny_export, spm_model, tmp_path):
    """Through the SavedModel: each phrase's pieces in the best translation (the tiny
    model writes to its limit; the complete outputs come first); a line without
    constraints gets the list it gets alone; a blank text's and a cut list's warnings."""
    import sentencepiece as spm

    from tfxformer.serving import load_nbest_fn
    from tfxformer.serving.nbest import Line

    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    nbest = load_nbest_fn(tiny_export, num_hypotheses=3, extra_length=16)
    assert nbest.takes_constraints
    lines = [Line("A dog runs in the park.", "", ["Hund", "im Park"]), "Two men talk.",
             Line("", "", "Hund"), Line("A woman sings.", "Eine", "Frau"),
             Line("A man.", "", "\t".join(["Mann"] + ["sehr langer Satz"] * 40))]
    lists, warnings = nbest(lines), nbest.warnings
    for line, found in zip(lines, lists, strict=True):
        if isinstance(line, Line) and line.text:
            best = found[0].text
            assert best.startswith(line.prefix)
            for phrase in line.constraints.split("\t")[:1]:
                assert _pieces_hold(processor, best, phrase), (best, phrase)
    alone = nbest(["Two men talk."])[0]
    assert [h.text for h in lists[1]] == [h.text for h in alone]
    np.testing.assert_allclose([h.score for h in lists[1]], [h.score for h in alone],
                               rtol=1e-5)
    assert warnings[2] == "blank text: constraints ignored"
    assert warnings[4].startswith("constraints cut to ")
    assert warnings[0] == warnings[1] == warnings[3] == ""


def test_an_export_without_the_input_refuses_constraints_only():
    """An export made before `constraints` existed (its `translate_nbest` without that
    input; here one that echoes the text) is called without it; asked for constraints,
    NBestFn says to re-export."""
    from tfxformer.config import DecodingOptions
    from tfxformer.serving.nbest import Line, NBestFn
    from tfxformer.serving.nbest_request import NBEST_SPECS
    from tfxformer.serving.signatures import OpenedSignature

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                  *NBEST_SPECS[:-1]])
    def before(text, beam_size, alpha, extra_length, max_input_tokens, num_hypotheses,
               no_repeat_ngram_size, repetition_penalty, target_prefix):
        return {"translations": text[:, None], "scores": tf.zeros_like(alpha)[:, None],
                "truncated": tf.zeros_like(text, tf.bool), "warning": target_prefix}

    options = DecodingOptions()
    opened = OpenedSignature(before.get_concrete_function(), None, "old_export",
                             "saved_model", (), options)
    nbest = NBestFn(opened, options, 1)
    assert not nbest.takes_constraints
    assert [[(h.text, h.score) for h in hypotheses] for hypotheses in nbest(["A dog runs."])] \
        == [[("A dog runs.", 0.0)]]
    with pytest.raises(ValueError, match="re-export"):
        nbest([Line("A dog runs.", "", ["Hund"])])


@pytest.mark.slow  # traces the n-best graph
def test_a_right_to_left_model_with_a_shortlist_holds_each_phrase(tiny_export, spm_model,
                                                                   spm_table):
    """A right-to-left model writes the pieces last first: its phrases are reversed, so
    the output, put back in reading order, holds each phrase; a vocabulary shortlist takes
    the phrases' pieces in, those it would leave out too."""
    import sentencepiece as spm
    from conftest import TINY_EXPORT_OPTIONS
    from support.steering import nbest_inputs

    from tfxformer import Transformer
    from tfxformer.decoding.shortlist import shortlist_ids
    from tfxformer.serving import Translator

    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    translator = Translator(Transformer.from_preset(tiny_export), spm_model,
                            reverse_target=True, shortlist=spm_table, **TINY_EXPORT_OPTIONS)
    texts, terms = ["A dog runs in the park.", "A woman sings."], ["Hund\tim Park", "Zebra"]
    listed = shortlist_ids(tf.constant([processor.encode(texts[1]) + [EOS_ID]]),
                           spm_table.table, spm_table.frequent).numpy().tolist()
    assert not set(processor.encode("Zebra")) <= set(listed)  # the shortlist lacks it
    out = translator.translate_nbest(tf.constant(texts), **nbest_inputs(
        2, num_hypotheses=1, extra_length=16, constraints=terms))
    best = [t.decode() for t in out["translations"].numpy()[:, 0]]
    for text, phrases in zip(best, terms, strict=True):
        for phrase in phrases.split("\t"):
            assert _pieces_hold(processor, text, phrase), (text, phrase)
    assert out["warning"].numpy().tolist() == [b"", b""]


def test_a_line_checks_its_phrases():
    from tfxformer.serving.nbest import Line

    assert Line("a", "", ["Hund", "im Park"]).constraints == "Hund\tim Park"
    assert Line("a", "", "Hund\tim Park").constraints == "Hund\tim Park"
    with pytest.raises(ValueError, match="TAB"):
        Line("a", "", ["Hund\tKatze"])


@pytest.mark.slow
def test_translate_script_takes_a_constraints_file(tiny_export, spm_model, tmp_path):
    import sentencepiece as spm
    from support.serving import load_script, run_script

    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    sources = ["A dog runs in the park.", "Two men talk.", "A woman sings."]
    terms = tmp_path / "terms"
    terms.write_text("Hund\tim Park\n\nFrau\n")
    stdout = run_script("translate", ["--model", tiny_export, "--constraints-file",
                                      str(terms), "--extra-length", "16"],
                        stdin="".join(s + "\n" for s in sources).encode())
    out = stdout.split("\n")[:-1]
    assert len(out) == 3
    assert _pieces_hold(processor, out[0], "Hund") and _pieces_hold(processor, out[0],
                                                                     "im Park")
    assert _pieces_hold(processor, out[2], "Frau")
    terms.write_text("Hund\n")
    with pytest.raises(SystemExit, match="has 1 lines; the input has more"):
        run_script("translate", ["--model", tiny_export, "--constraints-file", str(terms)],
                   stdin="".join(s + "\n" for s in sources).encode())
    with pytest.raises(SystemExit):
        load_script("translate").parse_args(["--model", tiny_export, "--constraints-file",
                                             str(terms), "--sampling-topk", "5"])


def test_repetition_controls_apply_with_constraints():
    """no_repeat_ngram_size 2 on top of the phrases: the outputs that end hold each phrase
    and repeat no pair of tokens."""
    out = outputs(search([[[21, 22]], [[5], [23]], [], [[24, 19]]], no_repeat_ngram_size=2))
    for sentence, wanted in zip(out, [[[21, 22]], [[5], [23]], [], [[24, 19]]], strict=True):
        assert sentence[0][1]
        for tokens, ended in sentence:
            pairs = list(zip(tokens, tokens[1:], strict=False))
            assert len(pairs) == len(set(pairs)), tokens
            if ended:
                assert all(holds(tokens, phrase) for phrase in wanted), (tokens, wanted)


def test_an_ensemble_takes_constraints():
    """Its averaged step is the search's step function: the best output of each sentence
    (the untrained members write to the limit; complete outputs come first) holds it."""
    from tfxformer import Transformer

    tf.random.set_seed(5)
    models = [Transformer.from_preset("tiny", vocab_size=VOCAB, max_positions=32)
              for _ in range(2)]
    steering = make_steering(2, constraints=tf.ragged.constant([[[7, 8]], [[9]]],
                                                               ragged_rank=2))
    out = beam_search(models, tf.constant([[5, 6, 3], [4, 3, 0]]), beam_size=3,
                      extra_length=8, steering=steering)
    best = [row[0][:n[0]].tolist() for row, n in zip(out.ids.numpy(), out.lengths.numpy(),
                                                      strict=True)]
    assert holds(best[0], [7, 8]) and holds(best[1], [9]), best


def test_translate_script_says_ctranslate2_has_no_constraints(tmp_path, capsys):
    from support.ctranslate2 import fake_ct2_dir
    from support.serving import load_script

    terms = tmp_path / "terms"
    terms.write_text("Hund\n")
    with pytest.raises(SystemExit) as exit_:
        load_script("translate").main(["--model", fake_ct2_dir(tmp_path / "ct2"),
                                       "--constraints-file", str(terms)])
    assert exit_.value.code == 2
    assert "CTranslate2 has no terminology constraints" in capsys.readouterr().err
