"""Output a translator can steer (docs/steering.md): the `translate_nbest` signature in
process and in the SavedModel, the Python n-best function, and translate.py --n-best."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
from conftest import tiny_export_translator
from support.serving import ROBUST_INPUTS, run_script, saved_models_loaded_once
from support.steering import SOURCES, cleaned, nbest_inputs

from tfxformer import pretrained
from tfxformer.decoding import EOS_ID, beam_search
from tfxformer.serving import load_nbest_fn
from tfxformer.serving.nbest import Hypothesis, Line, moses_lines


@pytest.fixture(scope="module")
def translator(tiny_export, spm_model):
    """The tiny export in process (conftest): beam 3, extra length 4, chunks of 3."""
    return tiny_export_translator(tiny_export, spm_model)


@pytest.fixture(scope="module")
def processor(spm_model):
    return spm.SentencePieceProcessor(model_proto=spm_model)


@pytest.fixture(scope="module", autouse=True)
def _export_loaded_once():
    """The tiny export is loaded once for the module: load_nbest_fn and translate.py here
    test what is done with it (test_serving.py tests loading it)."""
    with saved_models_loaded_once():
        yield


@pytest.fixture(scope="module")
def reference_search(translator):
    """beam_search over the translator's model with the export's options, as one
    tf.function (eagerly the search runs op by op): source (1, S) -> BeamSearchOutput."""
    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def search(source):
        return beam_search(translator.model, source, beam_size=3, alpha=0.6, extra_length=4,
                           max_output_length=translator.max_output_tokens,
                           stopping=translator.options.stopping)
    return search


def _lists(out):
    return [[t.decode("utf-8") for t in row] for row in out["translations"].numpy()]


def test_nbest_lists_are_the_beam_searchs_hypotheses(translator, processor, reference_search):
    """Each text's list is its beam's hypotheses, best first, with their scores; the first
    is what translate_per_example returns; "" / -inf pad a list to the batch's widest."""
    counts = [3, 2, 3, 1, 2]
    out = translator.translate_nbest(tf.constant(SOURCES),
                                     **nbest_inputs(5, num_hypotheses=counts))
    assert out["translations"].shape == (5, 3) and out["scores"].shape == (5, 3)
    best = translator.translate_per_example(tf.constant(SOURCES), [3] * 5, [0.6] * 5,
                                            [4] * 5, [48] * 5)
    assert [row[0] for row in _lists(out)] == [t.decode() for t in best["translation"].numpy()]
    np.testing.assert_allclose(out["scores"][:, 0], best["score"], rtol=1e-5)
    for i, text in enumerate(SOURCES):
        scores = out["scores"].numpy()[i]
        assert np.all(scores[counts[i]:] == -np.inf) and _lists(out)[i][counts[i]:] == [
            ""] * (3 - counts[i])
        if not text:  # a blank text: the empty translation, score 0
            assert _lists(out)[i][0] == "" and scores[0] == 0.0
            continue
        beams = reference_search(tf.constant([processor.encode(text) + [EOS_ID]]))
        expected = translator.detokenize(beams.ids[0], beams.lengths[0]).numpy()
        # an output holds no C0 control nor a "⁇" its source had not (serving/reading.py)
        assert _lists(out)[i][:counts[i]] == [cleaned(t.decode()) for t in expected[:counts[i]]]
        np.testing.assert_allclose(scores[:counts[i]], beams.scores[0, :counts[i]], rtol=1e-5)
        assert np.all(np.diff(scores[:counts[i]]) <= 0)  # best first


def test_nbest_takes_per_text_beams_and_any_input(translator):
    """Texts with other beam sizes are decoded apart (a list narrower than the batch's
    width is padded); hostile inputs give valid UTF-8; an empty batch gives (0, 1)."""
    texts = tf.constant(ROBUST_INPUTS[:16])
    beams = [1, 2, 3, 4] * 4
    out = translator.translate_nbest(texts, **nbest_inputs(16, beam_size=beams,
                                                           num_hypotheses=beams))
    assert out["translations"].shape == (16, 4)
    for row, beam in zip(_lists(out), beams, strict=True):  # strict UTF-8, as decoded
        assert row[beam:] == [""] * (4 - beam)
    alone = translator.translate_nbest(texts[3:4], **nbest_inputs(1, beam_size=4,
                                                                  num_hypotheses=4))
    assert _lists(alone)[0] == _lists(out)[3]
    empty = translator.translate_nbest(tf.constant([], tf.string), **nbest_inputs(0))
    assert empty["translations"].shape == (0, 1) and empty["truncated"].shape == (0,)
    huge = translator.translate_nbest(tf.constant([ROBUST_INPUTS[-1]]), **nbest_inputs(1))
    assert huge["truncated"].numpy().tolist() == [True]


def test_nbest_rejects_bad_counts(translator):
    for bad, message in ((dict(num_hypotheses=4), "`num_hypotheses` must be >= 1 and <= "
                                                  "`beam_size`"),
                         (dict(num_hypotheses=0), "`num_hypotheses` must be >= 1"),
                         (dict(beam_size=0, num_hypotheses=0), "`beam_size` must be >= 1")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            translator.translate_nbest(tf.constant(["A dog."]), **nbest_inputs(1, **bad))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one value per text"):
        translator.translate_nbest(tf.constant(["A dog.", "A cat."]),
                                   **{**nbest_inputs(2), "num_hypotheses": tf.constant([1])})


def test_prefixes_and_repetition_control_in_the_signature(translator):
    """A prefix starts every hypothesis; with one and more than one hypothesis the list
    holds the alternatives after it, each a different next piece, in the order of their
    probabilities; repetition options reach the search; hostile prefixes are flagged."""
    texts = tf.constant(SOURCES[:2] + [SOURCES[3]])
    prefixes = ["Ein Hund", "Zwei", ""]
    out = translator.translate_nbest(texts, **nbest_inputs(3, target_prefix=prefixes))
    lists = _lists(out)
    for row, prefix in zip(lists[:2], prefixes, strict=False):
        assert all(t.startswith(prefix) for t in row), row
    free = translator.translate_nbest(texts[2:], **nbest_inputs(1))
    assert lists[2] == _lists(free)[0]  # no prefix: the usual n-best list
    one = translator.translate_nbest(texts[:1], **nbest_inputs(1, num_hypotheses=1,
                                                               target_prefix="Ein Hund"))
    assert _lists(one)[0][0].startswith("Ein Hund")
    plain = translator.translate_nbest(texts, **nbest_inputs(3))
    banned = translator.translate_nbest(texts, **nbest_inputs(3, no_repeat_ngram_size=1,
                                                              repetition_penalty=1.5))
    assert _lists(plain) != _lists(banned)  # the rules themselves: the CTranslate2 test
    hostile = translator.translate_nbest(tf.constant(["A dog.", "A dog.", "", "A dog."]),
                                         **nbest_inputs(4, target_prefix=[
                                             "Hund " * 200, b"\xff\xfe Hund", "Hund", ""]))
    warnings = [w.decode() for w in hostile["warning"].numpy()]
    assert warnings[0].startswith("target_prefix cut to ") and "invalid UTF-8" in warnings[1]
    assert warnings[2] == "blank text: target_prefix ignored" and warnings[3] == ""
    assert _lists(hostile)[2] == ["", "", ""]
    for bad, message in ((dict(no_repeat_ngram_size=-1), "`no_repeat_ngram_size` must be"),
                         (dict(repetition_penalty=0.0), "`repetition_penalty` must be > 0")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            translator.translate_nbest(texts[:1], **nbest_inputs(1, **bad))


def test_alternatives_are_the_most_probable_next_pieces_each_continued(translator,
                                                                       processor):
    """After the prefix come the most probable pieces (EOS left out), most probable first,
    each the start of its own search's best continuation."""
    from tfxformer.decoding import score_targets
    from tfxformer.serving import nbest_lists

    source = translator.tokenize(tf.constant([SOURCES[0]])).to_tensor()
    prefix = processor.encode("Ein Hund")
    first = dict(beam_size=tf.constant(3), alpha=tf.constant(0.6),
                 extra_length=tf.constant(4))
    steer = nbest_lists.chunk_steering(tf.constant([0]), tf.constant([1.0]),
                                       tf.ragged.constant([prefix]))

    def search(source, steer):
        return translator.search.steered(source, first, steer, None)

    def first_pieces(rows, k):
        return translator.search.first_pieces(
            tf.gather(source, rows), tf.gather(steer.prefix, rows),
            tf.gather(steer.prefix_lengths, rows), tf.constant([0]), tf.constant([1.0]), k,
            None)

    def ids_text(ids, lengths):
        kept = tf.RaggedTensor.from_tensor(ids, lengths=lengths)
        return tf.strings.reduce_join(tf.strings.as_string(kept), axis=1, separator=" ")

    texts, _ = nbest_lists.steered_lists(search, first_pieces, source, steer,
                                         tf.constant([3]), 3, ids_text)
    hypotheses = [[int(t) for t in row.split()] for row in texts.numpy()[0]]
    assert all(h[:len(prefix)] == prefix for h in hypotheses)
    after = [h[len(prefix)] for h in hypotheses]
    assert len(set(after)) == 3 and EOS_ID not in after
    scored = score_targets(translator.model, tf.repeat(source, 3, axis=0),
                           [prefix + [token] for token in after])
    assert np.all(np.diff(scored.scores.numpy()) <= 0)  # most probable first


def test_python_function_on_the_saved_model_gives_the_graphs_lists(tiny_export,
                                                                    translator):
    """load_nbest_fn on the export (its `translate_nbest` signature) returns the lists of
    the in-process graph without their padding; Moses lines of them."""
    nbest = load_nbest_fn(tiny_export, num_hypotheses=2, batch_size=3)
    lists = nbest(SOURCES)
    here = translator.translate_nbest(tf.constant(SOURCES),
                                      **nbest_inputs(5, num_hypotheses=2))
    expected = [[(t, s) for t, s in zip(row, scores, strict=True) if s != -np.inf]
                for row, scores in zip(_lists(here), here["scores"].numpy(), strict=True)]
    assert [[h.text for h in row] for row in lists] == [[t for t, _ in r] for r in expected]
    np.testing.assert_allclose([h.score for row in lists for h in row],
                               [s for r in expected for _, s in r], rtol=1e-5)
    assert lists[2] == [Hypothesis("", 0.0)]
    prefixed = nbest([Line(SOURCES[0], "Ein Hund"), SOURCES[1]])
    assert all(h.text.startswith("Ein Hund") for h in prefixed[0]) and nbest.warnings == [
        "", ""]
    assert [h.text for h in prefixed[1]] == [h.text for h in lists[1]]
    assert moses_lines(7, [Hypothesis("Ein\nHund", -1.5)]) == ["7 ||| Ein Hund ||| -1.500000"]
    with pytest.raises(ValueError, match="`num_hypotheses` 4 must be <= the beam size 3"):
        load_nbest_fn(tiny_export, num_hypotheses=4)


@pytest.mark.slow
def test_translate_script_prints_moses_nbest_lines(tiny_export, translator, tmp_path):
    stdout = run_script("translate", ["--model", tiny_export, "--n-best", "2",
                                      "--batch-size", "3"],
                        stdin="".join(s + "\n" for s in SOURCES).encode())
    rows = [line.split(" ||| ") for line in stdout.split("\n")[:-1]]
    here = translator.translate_nbest(tf.constant(SOURCES),
                                      **nbest_inputs(5, num_hypotheses=2))
    expected = [(str(i), " ".join(t.split()), s) for i, (row, scores) in enumerate(zip(
        _lists(here), here["scores"].numpy(), strict=True))
        for t, s in zip(row, scores, strict=True) if s != -np.inf]
    assert [r[:2] for r in rows] == [list(e[:2]) for e in expected]
    np.testing.assert_allclose([float(r[2]) for r in rows], [e[2] for e in expected],
                               atol=1e-4)
    prefixes = tmp_path / "prefixes"
    prefixes.write_text("Ein Hund\n\n\nEine Frau\n\n")
    stdout = run_script("translate", ["--model", tiny_export, "--target-prefix-file",
                                      str(prefixes), "--repetition-penalty", "1.3"],
                        stdin="".join(s + "\n" for s in SOURCES).encode())
    here = translator.translate_nbest(tf.constant(SOURCES), **nbest_inputs(
        5, num_hypotheses=1, repetition_penalty=1.3,
        target_prefix=["Ein Hund", "", "", "Eine Frau", ""]))
    assert stdout.split("\n")[:-1] == [row[0].replace("\r", " ").replace("\n", " ")
                                       for row in _lists(here)]
    assert stdout.startswith("Ein Hund")


# --- repetition control and the forced prefix in the searches (tfxformer.decoding.steering)


def _ngram_bans_reference(history, n):
    """CTranslate2's NoRepeatNgram on one hypothesis, in Python: the tokens that followed an
    earlier occurrence of the last n - 1 tokens."""
    if n == 0 or len(history) < n:
        return set()
    suffix = history[len(history) - n + 1:] if n > 1 else []
    return {history[j + n - 1] for j in range(len(history) - n + 1)
            if history[j:j + n - 1] == suffix}


def test_steered_logits_follow_ctranslate2s_rules():
    """Penalty: logits of written tokens divided (positive) or multiplied (negative) by p;
    bans: NEG_INF on tokens completing a written n-gram, per row its own n."""
    from tfxformer.decoding.common import NEG_INF
    from tfxformer.decoding.steering import Steering, steer_logits

    rng = np.random.default_rng(0)
    rows, columns, vocab = 12, 9, 7
    history = rng.integers(4, vocab, (rows, columns)).astype(np.int32)
    history[:, 5:] = 0  # PAD past the written tokens
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    sizes = np.array([0, 1, 2, 3, 4, 5, 6, 2, 3, 1, 2, 0], np.int32)
    penalties = np.array([1.0, 1.5, 2.0, 1.0, 0.5, 1.2, 1.0, 3.0, 1.0, 1.0, 1.3, 2.0],
                         np.float32)
    steering = Steering(tf.constant(sizes), tf.constant(penalties), tf.zeros([rows, 0],
                                                                             tf.int32),
                        tf.zeros([rows], tf.int32))
    got = steer_logits(tf.constant(logits), tf.constant(history), tf.constant(5),
                       steering).numpy()
    for r in range(rows):
        written = history[r, :5].tolist()
        expected = logits[r].copy()
        for token in set(written):
            value = expected[token]
            expected[token] = value * penalties[r] if value < 0 else value / penalties[r]
        for token in _ngram_bans_reference(written, int(sizes[r])):
            expected[token] = NEG_INF
        np.testing.assert_allclose(got[r], expected, rtol=1e-6, err_msg=str(r))
    assert _ngram_bans_reference([5, 6, 5, 6, 5], 3) == {6}  # the reference itself


def test_a_forced_prefix_starts_every_hypothesis_and_keeps_one_alive(tiny_config):
    """The prefix is written with the model's log-probabilities (the n-best lists' scores
    are log P(Y | X) of the whole output), one hypothesis alive while it is forced (no
    duplicates), then the search goes on; greedy and beam 1 agree with repetition control."""
    from tfxformer import Transformer
    from tfxformer.decoding import greedy_decode, score_targets
    from tfxformer.decoding.steering import make_steering

    model = Transformer(tiny_config)
    source = tf.constant([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    prefix = tf.ragged.constant([[11, 12, 13], []])
    steering = make_steering(2, prefix=prefix)
    out = beam_search(model, source, beam_size=4, alpha=0.0, extra_length=6,
                      steering=steering, stopping="bound")
    ids = out.ids.numpy()
    assert np.all(ids[0, :, :3] == [11, 12, 13])
    assert len({tuple(row) for row in ids[0]}) == 4  # four different hypotheses
    scored = score_targets(model, tf.repeat(source[:1], 4, axis=0), out.ids[0])
    np.testing.assert_allclose(out.scores[0], scored.scores, rtol=1e-4)
    free = beam_search(model, source[1:], beam_size=4, alpha=0.0, extra_length=6,
                       stopping="bound")
    assert ids[1].tolist() == free.ids[0].numpy().tolist()  # no prefix: as without
    controls = dict(no_repeat_ngram_size=2, repetition_penalty=1.7)
    greedy = greedy_decode(model, source, extra_length=6,
                           steering=make_steering(2, prefix=prefix, **controls))
    beam1 = beam_search(model, source, beam_size=1, alpha=0.0, extra_length=6,
                        steering=make_steering(2, prefix=prefix, **controls))
    assert greedy.ids.numpy().tolist() == beam1.ids[:, 0].numpy().tolist()
    for row in greedy.ids.numpy():  # no 2-gram twice
        tokens = [t for t in row.tolist() if t not in (0, 3)]
        pairs = list(zip(tokens, tokens[1:], strict=False))
        assert len(pairs) == len(set(pairs))
    assert make_steering(2) is None  # every option off: the search as without steering
    with pytest.raises(ValueError, match="`repetition_penalty` must be a number > 0"):
        make_steering(2, repetition_penalty=0.0)


def test_repetition_control_decodes_as_ctranslate2(tiny_config, tmp_path):
    """On the same weights our beam search with CTranslate2's rules (stop at beam-size
    finished, |Y|^α) and its repetition options writes what CTranslate2 writes."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tfxformer import Transformer
    from tfxformer.decoding.steering import make_steering
    from tfxformer.serving import ctranslate2 as ct2
    from tfxformer.serving import ctranslate2_export as ct2_export

    model = Transformer(tiny_config)
    model.build()
    pieces = list(ct2.SPECIAL_PIECES) + [f"t{i}" for i in range(4, tiny_config.vocab_size)]
    weights = {pretrained.weight_key(w.path): w.numpy() for w in model.weights}
    ct2_export.save_spec(ct2_export.build_spec(tiny_config, weights, pieces), str(tmp_path))
    translator = ctranslate2.Translator(str(tmp_path), device="cpu", intra_threads=1)
    rng = np.random.default_rng(1)
    source = rng.integers(4, tiny_config.vocab_size, (4, 6)).astype(np.int32)
    source[:, -1] = EOS_ID
    extra, written = 8, {}
    for beam, ngram, penalty in ((3, 0, 1.0), (3, 2, 1.0), (3, 0, 1.8), (1, 1, 1.0),
                                 (2, 3, 0.7)):
        ours = beam_search(model, source, beam_size=beam, alpha=1.0, extra_length=extra,
                           stopping="finished", length_normalization="length",
                           steering=make_steering(4, ngram, penalty))
        theirs = translator.translate_batch(
            [[pieces[i] for i in row] for row in source], beam_size=beam, length_penalty=1.0,
            max_decoding_length=source.shape[1] + extra, suppress_sequences=[["<pad>"],
                                                                             ["<s>"]],
            repetition_penalty=penalty, no_repeat_ngram_size=ngram)
        for row, result in zip(ours.ids.numpy()[:, 0], theirs, strict=True):
            assert [pieces[i] for i in row if i not in (0, EOS_ID)] == \
                result.hypotheses[0], (beam, ngram, penalty)
        written[beam, ngram, penalty] = ours.ids.numpy()[:, 0].tolist()
    assert written[3, 0, 1.0] != written[3, 2, 1.0] and written[3, 0, 1.0] != written[3, 0, 1.8]

